"""Leased loopback ports (``robot_io.ports``) and site copies on them (``robot_io.site.relocate_site``): what lets
several simulator bridges (``vla eval --workers``, ``vla rl --actors``, benchmarks) run side by side."""

from __future__ import annotations

import socket
import subprocess
import sys
import textwrap

import pytest
import yaml

from robot_io.ports import PortLease, _ephemeral_low
from robot_io.site import SiteError, load_site, relocate_site, site_ports


def test_leases_never_share_a_port_even_across_processes():
    """Another process holds a lease of 300 ports while this one leases 300 more: no port in both, all below the
    kernel's ephemeral range and free to bind; released ports can be leased again."""
    code = textwrap.dedent("""
        import sys
        from robot_io.ports import PortLease
        lease = PortLease(300)
        print(" ".join(map(str, lease.ports)), flush=True)
        sys.stdin.readline()
    """)
    other = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        theirs = set(map(int, other.stdout.readline().split()))
        assert len(theirs) == 300
        with PortLease(300) as mine:
            assert len(set(mine.ports)) == 300 and not theirs & set(mine.ports)
            assert all(p < _ephemeral_low() for p in mine.ports)
            for p in mine.ports[:20]:
                with socket.socket() as s:
                    s.bind(("127.0.0.1", p))  # free: the lease holds a lock, not the port
    finally:
        other.stdin.close()
        other.wait(timeout=10)
    with pytest.raises(ValueError, match="n >= 1"):
        PortLease(0)


def test_a_site_copy_moves_every_port_it_names_consistently(tmp_path):
    site = load_site("sim-rig")
    old = site_ports(site)
    assert len(old) == 6  # screen command / stream / HID link, camera command / stream, keyboard
    with PortLease(len(old)) as lease:
        copy = relocate_site(site, lease.ports, str(tmp_path / "rig.yaml"), name="rig-w0")
        assert copy.name == "rig-w0" and set(site_ports(copy)) == set(lease.ports)
        d = copy.devices
        assert d["screen_cam"].params["screen"] == d["screen"].stream  # the camera still films this screen
        assert d["screen"].params["hid_endpoint"].rpartition(":")[2] == str(lease.ports[old.index(5589)])


def test_a_copy_keeps_relative_files_and_a_real_robot_is_never_copied(tmp_path):
    (tmp_path / "lab").mkdir()
    (tmp_path / "lab/site.yaml").write_text(yaml.safe_dump({
        "name": "lab", "robot": {"arm": "arm"},
        "devices": {"arm": {"driver": "sim_franka", "command": "tcp://127.0.0.1:7100", "stream": "tcp://127.0.0.1:7101",
                            "calibration": "calib/arm.yaml"}}}))
    site = load_site(str(tmp_path / "lab/site.yaml"))
    copy = relocate_site(site, [31000, 31001], str(tmp_path / "copy.yaml"))
    assert copy.devices["arm"].calibration == str(tmp_path / "lab/calib/arm.yaml")
    assert copy.devices["arm"].command == "tcp://127.0.0.1:31000" and copy.name == "lab-31000"
    with pytest.raises(ValueError, match="uses 2 ports, 1 given"):
        relocate_site(site, [31000], str(tmp_path / "short.yaml"))
    with pytest.raises(SiteError, match=r"devices\.arm\.command.*not a loopback"):
        site_ports(load_site("franka-lab"))
