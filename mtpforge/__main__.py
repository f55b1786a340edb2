import sys

try:
    from .cli import main
except KeyboardInterrupt:  # Ctrl-C while the command line was still loading: nothing was touched
    import os

    sys.stderr.write("error: interrupted before anything was written — fix: re-run the command; every folder was left as it was\n")
    sys.stderr.flush()
    os._exit(130)  # not sys.exit: an import interrupted inside the builtin exec would make Python end with -2 (see cli)

main()
