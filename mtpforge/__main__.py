import sys

try:
    from .cli import main
except KeyboardInterrupt:  # Ctrl-C while the command line was still loading: nothing was touched
    sys.stderr.write("error: interrupted — fix: re-run the command; the model folder was left as it was\n")
    sys.exit(130)

main()
