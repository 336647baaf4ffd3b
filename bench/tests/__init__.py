"""Tests of bench/ itself: the harness and the benches' own pieces (bodies, reports, statistics). They may
import bench (tests/ never does) and never import tests/."""
