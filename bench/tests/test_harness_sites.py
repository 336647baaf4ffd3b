"""bench.harness.sites: sim presets copied onto fixed or leased ports."""


def test_worker_sites_copy_the_named_preset_onto_their_own_ports(tmp_path):
    import yaml

    from bench.harness.sites import site_with_ports

    from robot_io.site import load_site

    site = load_site(site_with_ports(str(tmp_path / "s.yaml"), 6500, "sim-franka-fast-3cam"))
    assert site.cameras == ("front", "wrist", "side")
    ports = [d.command for d in site.devices.values()]
    assert len(set(ports)) == 4 and all(":65" in p for p in ports)
    assert yaml.safe_load((tmp_path / "s.yaml").read_text())["devices"]["side"]["roi"] == [0.0, 0.3, 1.0, 0.9]


def test_bench_sites_lease_distinct_ports_held_until_the_block_ends(tmp_path):
    """Without --port0 each site gets ports leased on this machine: distinct across sites, held (another lease
    cannot take them) for the block, given back after it."""
    from bench.harness.sites import bench_sites
    from robot_io.ports import PortLease
    from robot_io.site import load_site, site_ports

    with bench_sites(2, str(tmp_path)) as paths:
        ports = [site_ports(load_site(p)) for p in paths]
        assert len(paths) == 2 and not set(ports[0]) & set(ports[1])
        assert load_site(paths[0]).cameras == load_site("sim-franka-fast").cameras
        held = set(ports[0]) | set(ports[1])
        with PortLease(40) as other:
            assert not held & set(other.ports)
    with bench_sites(1, str(tmp_path), port0=6500) as (fixed,):
        assert min(site_ports(load_site(fixed))) == 6500
