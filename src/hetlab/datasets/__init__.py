"""LeRobot v3.0 datasets.

lerobot_format  the directory layout and metadata both sides agree on
lerobot_writer  LeRobotWriter: creates or continues a dataset, one atomically committed episode at a time
lerobot         LeRobotDataset: a torch Dataset over any v3.0 dataset on disk, validated up front
video           AV1 encoding and timestamp-addressed decoding with PyAV
stats           per-feature normalisation statistics, per episode and aggregated

Nothing is imported here, so that recording workers do not pay for torch.
"""
