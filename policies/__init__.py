"""RL modules that steer a VLA (DSRL, ExToken, SARL, LfH, safety layers) and their shared SAC / GRPO / replay pieces. Talks to robots only through robot_io or a gymnasium.Env."""
