"""`python -m venv --without-pip ENV`: the one form lich_runtime.py runs."""
import argparse

from venv import create

parser = argparse.ArgumentParser(prog="venv (stand-in)")
parser.add_argument("--without-pip", action="store_true", required=True)
parser.add_argument("env")
create(parser.parse_args().env)
