"""The gpu_asset decorator, its compute requirement and cost link, and the demo training asset."""
