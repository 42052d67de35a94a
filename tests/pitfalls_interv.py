# Exercises 6-8's pitfalls (docs/INSTRUCTOR.md) as changes of the reference, each failing its check:
# (exercise, a phrase of the pitfall's bullet, file, the reference's text, the pitfall's text)
PITFALLS = [
    (6, "The sample variance (N - 1)", "interventions.py",
     "h.var(1, unbiased=False)",
     "h.var(1)"),
    (6, "Pooling per element or per layer", "interventions.py",   # per element: over the batch only
     "self.var[i] = 0.9 * h.var(1, unbiased=False)",
     'self.var[i] = 0.9 * layer["h"].detach().float().cpu().var(0, unbiased=False).flatten(1).mean(1)'),
    (6, "Pooling per element or per layer", "interventions.py",   # per layer: one mean and variance
     "self.mu[i] = 0.9 * h.mean(1) + 0.1 * self.mu[i]\n"
     "            self.var[i] = 0.9 * h.var(1, unbiased=False) + 0.1 * self.var[i]",
     "self.mu[i] = 0.9 * h.mean() + 0.1 * self.mu[i]\n"
     "            self.var[i] = 0.9 * h.var(unbiased=False) + 0.1 * self.var[i]"),
    (6, "Swapping the weights", "interventions.py",
     "self.mu[i] = 0.9 * h.mean(1) + 0.1 * self.mu[i]\n"
     "            self.var[i] = 0.9 * h.var(1, unbiased=False) + 0.1 * self.var[i]",
     "self.mu[i] = 0.1 * h.mean(1) + 0.9 * self.mu[i]\n"
     "            self.var[i] = 0.1 * h.var(1, unbiased=False) + 0.9 * self.var[i]"),
    (6, "Drawing noise only when var > 0", "interventions.py",
     "noise = torch.randn(h.shape, generator=self.gen)",
     "noise = torch.randn(h.shape, generator=self.gen) if (var > 0).any() else torch.zeros(h.shape)"),
    (6, "Putting noise on the conv window or token shift", "interventions.py",   # Mamba's conv window
     'layer["h"] = (mu.view(shape) + var.sqrt().view(shape) * noise).to(h.device)',
     'layer["h"] = (mu.view(shape) + var.sqrt().view(shape) * noise).to(h.device)\n'
     '            if "conv" in layer:\n'
     '                layer["conv"] = var.mean().sqrt() * '
     'torch.randn(layer["conv"].shape, generator=self.gen)'),
    (6, "Putting noise on the conv window or token shift", "interventions.py",   # RWKV-6's token shifts
     'layer["h"] = (mu.view(shape) + var.sqrt().view(shape) * noise).to(h.device)',
     'layer["h"] = (mu.view(shape) + var.sqrt().view(shape) * noise).to(h.device)\n'
     '            for k in [k for k in ("shift", "ffn_shift") if k in layer]:\n'
     '                layer[k] = var.mean().sqrt() * torch.randn(layer[k].shape, generator=self.gen)'),
    (7, "Not detaching", "interventions.py",
     "{k: v.detach().float() for k, v in layer.items()}",
     "{k: v.float() for k, v in layer.items()}"),
    (7, 'Resetting "h" only', "interventions.py",
     "{k: v * keep.to(v).view(-1, *[1] * (v.dim() - 1)) for k, v in layer.items()}",
     '{k: v * keep.to(v).view(-1, *[1] * (v.dim() - 1)) if k == "h" else v for k, v in layer.items()}'),
    (7, "Zeroing rows of `self.passed` in place", "interventions.py",
     "return [{k: v * keep.to(v).view(-1, *[1] * (v.dim() - 1)) for k, v in layer.items()}\n"
     "                for layer in self.passed]",
     "for layer in self.passed:\n"
     "            for v in layer.values():\n"
     "                v[~keep] = 0\n"
     "        return self.passed"),
    (7, "Drawing the reset mask before the first batch", "interventions.py",
     "        if self.passed is None:  # the first batch: the zero state\n"
     "            return None\n"
     "        keep = (~batch.new_doc if self.by_document\n"
     "                else torch.rand(self.batch_size, generator=self.gen) >= self.p_reset)",
     "        drawn = torch.rand(self.batch_size, generator=self.gen) >= self.p_reset\n"
     "        if self.passed is None:  # the first batch: the zero state\n"
     "            return None\n"
     "        keep = ~batch.new_doc if self.by_document else drawn"),
    (8, "Counting the (eot, first token) pair as a bigram of the chain", "data.py",
     "counts[rows, prev, nxt] += (~at_start).double()",
     "counts[rows, prev, nxt] += 1"),
    (8, "Updating the counts before scoring the target", "data.py",
     "        row = counts[rows, prev] + prior[prev]   # [n, k] posterior pseudo-counts\n"
     "        nll[:, t] = torch.log(row.sum(-1)) - torch.log(row[rows, nxt])\n"
     "        nll[at_start, t] = math.log(k)\n"
     "        counts[rows, prev, nxt] += (~at_start).double()   # (eot, first token) is not a bigram of P\n",
     "        counts[rows, prev, nxt] += (~at_start).double()\n"
     "        row = counts[rows, prev] + prior[prev]   # [n, k] posterior pseudo-counts\n"
     "        nll[:, t] = torch.log(row.sum(-1)) - torch.log(row[rows, nxt])\n"
     "        nll[at_start, t] = math.log(k)\n"),
    (8, "A scalar alpha where `prior` is a [k, k] matrix", "data.py",
     "row = counts[rows, prev] + prior[prev]",
     "row = counts[rows, prev] + alpha"),
]
