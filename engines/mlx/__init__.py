"""The MLX engine (engines/mlx/engine.py): targets through mlx-lm, the DFlash draft as an MLX module.

Nothing is imported here, so `import engines.mlx` works without MLX; `engines.mlx.engine` raises
ImportError when mlx or mlx-lm is missing, which `engines.load_engine` turns into one sentence.
"""
