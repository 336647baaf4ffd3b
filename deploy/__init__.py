"""Deployment. ``deploy.runtime`` is the edge half (numpy + onnxruntime + robot_io only: it runs on a
Raspberry Pi without torch); exporting and quantising a trained VLA (torch) lives beside it."""
