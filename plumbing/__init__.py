"""The plumbing a reader of the paper skips, one concern a file: train.py's flags and their checks (flags),
evaluate.py's (eval_flags), bench.py's (bench_flags) and its scans' inputs (bench_inputs), a strategy's
options checked as the flags check them (strategy_options), files and atomic writes (files), tokenizers
(tokenizers), the token cache and the tokenize-only command (token_cache), the Markov spec (markov_spec),
task text hidden in filler (filler), checkpoints (checkpoints), run folders and how a run ends (runs),
mamba_ssm's layout and the hub (official; export), torchrun's process group (distributed), report tables
and figures (report), the demo's orchestration (demo), the bAbI world (babi) and the scans' shared checks
and kernel launch (scans)."""
