import sys

from polykit.compat import run_script

run_script(sys.argv[1:])
