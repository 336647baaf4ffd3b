"""Camera intrinsics, hand-eye, screen homography, latency and clock-offset calibration."""
