"""The wheel `sqlite-ratelimit`: the SQLite loadable extension and a load(conn) helper.
Built by scripts/package.sh, which puts the library next to __init__.py and passes the
version of the workspace's Cargo.toml."""
import os

from setuptools import setup
from wheel.bdist_wheel import bdist_wheel


class PlatformWheel(bdist_wheel):
    """Holds a compiled library that no Python version is tied to: tagged py3-none-<platform>."""

    def finalize_options(self):
        super().finalize_options()
        self.root_is_pure = False

    def get_tag(self):
        return "py3", "none", super().get_tag()[2]


setup(
    name="sqlite-ratelimit",
    version=os.environ["SQLITE_RATELIMIT_VERSION"],
    description="Rate limits (token buckets) and spending budgets inside SQLite: a loadable extension",
    long_description=open(os.path.join(os.path.dirname(__file__), "README.md")).read(),
    long_description_content_type="text/markdown",
    license="MIT",
    packages=["sqlite_ratelimit"],
    package_data={"sqlite_ratelimit": ["libratelimit.so"]},
    python_requires=">=3.8",
    cmdclass={"bdist_wheel": PlatformWheel},
    zip_safe=False,
)
