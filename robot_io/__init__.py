"""The ZMQ hardware bridge. Imports numpy, pyzmq, msgpack, pyyaml only (no torch)."""
