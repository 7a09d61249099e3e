"""Built-in profiles (data only), installed as `dflash_tui.profiles_data`.

This file makes the directory a regular package: setuptools' editable install cannot find a nested
namespace package that maps to another directory, so without it `pip install -e .` finds no profiles.
"""
