"""Network pieces of the VLA backbones (torch)."""
