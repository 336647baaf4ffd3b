"""`vla rig`: help works for every part; bad arguments give one clear line, no traceback."""

import pytest

from vla.cli import main


@pytest.mark.parametrize("part", ["host", "camera", "mcu", "agent", "calibrate"])
def test_rig_help(part, capsys):
    with pytest.raises(SystemExit) as e:
        main(["rig", part, "--help"])
    assert e.value.code == 0 and "--site" in capsys.readouterr().out


def test_rig_bad_args(capsys):
    assert main(["rig", "agent", "--policy", "dqn"]) == 2
    assert "--policy dqn needs --checkpoint" in capsys.readouterr().err
    assert main(["rig", "agent", "--seconds", "-1"]) == 2
    assert "--seconds must be positive" in capsys.readouterr().err
    assert main(["rig", "host", "--site", "sim-rigg"]) == 2
    assert "Did you mean 'sim-rig'" in capsys.readouterr().err
    assert main(["rig", "host", "--site", "sim-franka"]) == 2  # not a rig site
    assert "has no screen / keyboard device" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        main(["rig", "agent", "--policy", "ppo"])
    assert e.value.code == 2 and "invalid choice" in capsys.readouterr().err
