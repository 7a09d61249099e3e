"""Only what pyproject.toml cannot say: the sdist keeps the package's two links as links.

dflash_tui/engines -> ../engines and dflash_tui/profiles_data -> ../profiles (pyproject.toml says why they
are links). setuptools would copy each file behind a link into the sdist a second time (the demo weights,
9.6 MB, twice); here the files travel once, at their repository paths, and each link as a link. pip,
build and uv unpack such relative links inside the archive (PEP 706's data filter allows them), and the
wheel built from the unpacked sdist follows them as a build from the repository does.
"""

import os

from setuptools import setup
from setuptools.command.sdist import sdist

LINKS = ("dflash_tui/engines", "dflash_tui/profiles_data")


class SdistKeepingLinks(sdist):
    def make_release_tree(self, base_dir, files):
        links = [link for link in LINKS if os.path.islink(link)]
        behind = tuple(link + "/" for link in links)
        super().make_release_tree(base_dir, [f for f in files if not f.replace(os.sep, "/").startswith(behind)])
        for link in links:
            os.symlink(os.readlink(link), os.path.join(base_dir, link))


setup(cmdclass={"sdist": SdistKeepingLinks})
