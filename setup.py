from setuptools import setup

# Everything lives in setup.cfg; this file keeps `pip install -e .` working on
# older pip/setuptools combinations.
setup()
