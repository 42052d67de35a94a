"""A Mamba run of ours in mamba_ssm's layout (config.json + pytorch_model.bin), which
MambaLMHeadModel.from_pretrained reads and our loader reads back bit-exact:

    python -m plumbing.export out/base exported/mamba2-tiny
"""
import argparse
import signal
import sys

from plumbing import checkpoints, official

def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.error = lambda message: p.exit(2, f"error: {message}\n")   # one line, as every other bad input
    p.add_argument("run", metavar="RUN", help="our run folder or its ckpt.pt (a Mamba-1 or -2 LM)")
    p.add_argument("out", metavar="OUT", help="a new or empty folder: it gets config.json, pytorch_model.bin")
    args = p.parse_args(argv)
    run = args.run
    out = args.out
    if not run.strip() or not out.strip():   # "" would read as the working folder
        p.error(f"RUN {run!r} OUT {out!r}: RUN and OUT must not be empty")
    signal.signal(signal.SIGTERM, signal.default_int_handler)   # SIGTERM as Ctrl-C: export removes its files
    try:
        official.require_new(out)   # before reading RUN, which may take long
        official.export(checkpoints.from_pretrained(run), out)
    except (OSError, ValueError) as e:
        sys.exit(f"error: {e}")
    except KeyboardInterrupt:
        sys.exit(f"interrupted: nothing written to {out}")
    print(f"{out}: config.json, pytorch_model.bin (mamba_ssm's MambaLMHeadModel.from_pretrained reads it)")

if __name__ == "__main__":
    main()
