"""hetlab: robot policy training with each stage of the loop on the device that suits it."""

__version__ = "0.1.0"
