"""The paper's synthetic study (Baaj & Marquis 2026, section 5.3; spec 6.2): Model A vs Model B.

20 classes with Gaussian prototypes ``mu_c = beta Z_c``; samples ``x = mu_c + 2 nu``; each
training example gets a staircase possibility label (``pi_c = 1``, the other classes ranked by
distance to ``x`` with ``pi = rho + max(0, alpha(x) - 0.01 (r - 1))``). Linear softmax heads:

* Model A: ``KL(p* || q)`` with ``p*`` the KL projection of the prediction onto the credal
  set (``losszoo.ops.possibilistic_projection_loss``; paper settings: gap-wide, eps_cap 1e-9,
  tol 1e-8, K_max 2000, paper stopping rule);
* Model B: ``KL(pdot || q)`` with the fixed antipignistic target.

Adam with coupled L2 weight decay 1e-4 (as PyTorch's ``Adam(weight_decay=...)``), float64,
W ~ N(0, 0.01^2), batch 64 (N_tr <= 200) or 128, 80 or 60 epochs. The learning rate of each
model is chosen on validation accuracy over a grid, then several fresh runs report test
accuracy (mean ± sd when there are several runs) beside the paper's Table 5.

    python examples/possibilistic_synthetic.py --quick     # about 5 minutes on 2 cores
    python examples/possibilistic_synthetic.py --quick --out examples/results  # committed
    python examples/possibilistic_synthetic.py --full      # the paper's 36 configurations
    python examples/possibilistic_synthetic.py --smoke     # one configuration, 2 epochs
"""

from __future__ import annotations

import os
import sys
import time

os.environ.setdefault("KERAS_BACKEND", "tensorflow")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common  # noqa: E402


def build_parser():
    """The options (argparse only: defined before Keras is imported)."""
    parser = _common.make_parser("possibilistic_synthetic", __doc__)
    parser.add_argument(
        "--quick",
        action="store_true",
        help="4 configurations, 3 learning rates per model, 3 runs (the default)",
    )
    parser.add_argument(
        "--full",
        action="store_true",
        help="the paper's 36 configurations, 27 learning rates, 10 runs",
    )
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="one configuration, the paper's learning rates, 1 run, 2 epochs",
    )
    parser.add_argument(
        "--runs",
        type=int,
        default=None,
        help="final runs per configuration (None: 3 quick, 10 full)",
    )
    parser.add_argument("--verbose", action="store_true", help="also print a line per grid point")
    return parser


if __name__ == "__main__":  # --help and bad options answer here, before Keras starts
    build_parser().parse_args()


import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from losszoo import ops  # noqa: E402
from losszoo.ops.possibilistic import ProjectionConfig  # noqa: E402

# The paper's setting: stopping rule "paper", tolerance 1e-8, eps 1e-9.
PAPER_CONFIG = ProjectionConfig(tol=1e-8, max_cycles=2000, stopping="paper", eps_cap=1e-9)

SCRIPT = "possibilistic_synthetic"

K, RHO, SCALE = 20, 1e-6, 2.0
BETA = {30: 1.5, 80: 0.9, 150: 0.6}
# Paper Table 5: (d, alpha, N_tr) -> (lr_A, lr_B, acc_A, sd_A, acc_B, sd_B)
PAPER = {
    (30, 0.40, 200): (0.01, 0.0008, 0.9118, 0.0184, 0.8689, 0.0173),
    (30, 0.40, 500): (0.03, 0.002, 0.9258, 0.0161, 0.9055, 0.0167),
    (30, 0.40, 1000): (0.006, 0.001, 0.9277, 0.0150, 0.9287, 0.0136),
    (30, 0.60, 200): (0.02, 0.0006, 0.9286, 0.0155, 0.8629, 0.0172),
    (30, 0.60, 500): (0.03, 0.001, 0.9353, 0.0127, 0.9096, 0.0159),
    (30, 0.60, 1000): (0.01, 0.0006, 0.9384, 0.0143, 0.9291, 0.0136),
    (30, 0.80, 200): (0.006, 0.0004, 0.9358, 0.0136, 0.8414, 0.0201),
    (30, 0.80, 500): (0.007, 0.0006, 0.9425, 0.0109, 0.9011, 0.0173),
    (30, 0.80, 1000): (0.008, 0.0007, 0.9467, 0.0107, 0.9241, 0.0139),
    (30, 0.95, 200): (0.004, 0.0003, 0.9392, 0.0133, 0.8026, 0.0342),
    (30, 0.95, 500): (0.007, 0.0003, 0.9464, 0.0112, 0.8864, 0.0185),
    (30, 0.95, 1000): (0.002, 0.0003, 0.9485, 0.0105, 0.9159, 0.0152),
    (80, 0.40, 200): (0.005, 0.0005, 0.9102, 0.0105, 0.8136, 0.0196),
    (80, 0.40, 500): (0.006, 0.0008, 0.9407, 0.0076, 0.8932, 0.0133),
    (80, 0.40, 1000): (0.007, 0.0003, 0.9497, 0.0061, 0.9314, 0.0094),
    (80, 0.60, 200): (0.007, 0.0004, 0.9341, 0.0085, 0.8084, 0.0205),
    (80, 0.60, 500): (0.009, 0.0005, 0.9531, 0.0069, 0.8939, 0.0138),
    (80, 0.60, 1000): (0.006, 0.0002, 0.9571, 0.0057, 0.9303, 0.0103),
    (80, 0.80, 200): (0.006, 0.0003, 0.9470, 0.0092, 0.7772, 0.0211),
    (80, 0.80, 500): (0.007, 0.0003, 0.9584, 0.0061, 0.8836, 0.0138),
    (80, 0.80, 1000): (0.007, 0.0002, 0.9603, 0.0058, 0.9236, 0.0088),
    (80, 0.95, 200): (0.008, 0.0002, 0.9504, 0.0078, 0.7310, 0.0137),
    (80, 0.95, 500): (0.009, 0.0002, 0.9599, 0.0062, 0.8592, 0.0176),
    (80, 0.95, 1000): (0.008, 0.0002, 0.9592, 0.0055, 0.9097, 0.0107),
    (150, 0.40, 200): (0.003, 0.001, 0.7931, 0.0161, 0.6759, 0.0189),
    (150, 0.40, 500): (0.005, 0.0004, 0.8914, 0.0063, 0.7978, 0.0090),
    (150, 0.40, 1000): (0.006, 0.0002, 0.9188, 0.0065, 0.8663, 0.0071),
    (150, 0.60, 200): (0.004, 0.0008, 0.8408, 0.0108, 0.6515, 0.0179),
    (150, 0.60, 500): (0.004, 0.0005, 0.9187, 0.0048, 0.7862, 0.0095),
    (150, 0.60, 1000): (0.009, 0.0002, 0.9293, 0.0060, 0.8626, 0.0079),
    (150, 0.80, 200): (0.003, 0.0003, 0.8545, 0.0110, 0.6042, 0.0208),
    (150, 0.80, 500): (0.006, 0.0003, 0.9306, 0.0043, 0.7628, 0.0086),
    (150, 0.80, 1000): (0.006, 0.0002, 0.9342, 0.0056, 0.8417, 0.0080),
    (150, 0.95, 200): (0.004, 0.0005, 0.8697, 0.0125, 0.5343, 0.0214),
    (150, 0.95, 500): (0.009, 0.0002, 0.9346, 0.0050, 0.7203, 0.0119),
    (150, 0.95, 1000): (0.003, 0.0002, 0.9354, 0.0052, 0.8147, 0.0123),
}


def make_data(rng, d, n_tr, n_te=3000):
    """Prototypes, (x, c) for train / val / test (spec 6.2)."""
    mu = BETA[d] * rng.normal(size=(K, d))

    def sample(n):
        c = rng.integers(K, size=n)
        return mu[c] + SCALE * rng.normal(size=(n, d)), c

    return mu, sample(n_tr), sample(n_tr), sample(n_te)


def staircase(rng, x, c, mu, alpha):
    """Possibility labels: pi_c = 1, others ranked by ||x - mu_j||^2 (ties by index)."""
    n = len(x)
    dist = ((x[:, None, :] - mu[None]) ** 2).sum(-1)
    pi = np.zeros((n, K))
    a = np.clip(alpha + 0.15 * rng.normal(size=n), 0.0, 1 - RHO)
    for i in range(n):
        others = [j for j in np.argsort(dist[i], kind="stable") if j != c[i]]
        steps = np.maximum(0.0, a[i] - 0.01 * np.arange(K - 1))
        pi[i, others] = np.minimum(1 - RHO, RHO + steps)
        pi[i, c[i]] = 1.0
    return pi


class LinearTrainer:
    """Linear softmax head + Adam (coupled L2) in one XLA-compiled step per (d, batch)."""

    def __init__(self, d, batch, model):
        self.batch, self.model = batch, model
        f64 = tf.float64
        self.w = tf.Variable(tf.zeros([d, K], f64))
        self.b = tf.Variable(tf.zeros([K], f64))
        self.slots = [tf.Variable(tf.zeros_like(v)) for v in (self.w, self.b) for _ in (0, 1)]
        self.t = tf.Variable(0.0, dtype=f64)
        self.lr = tf.Variable(0.0, dtype=f64)
        self.cycles = []
        self._step = tf.function(self._train_step, jit_compile=True)

    def reset(self, rng, lr):
        self.w.assign(0.01 * rng.normal(size=self.w.shape))
        self.b.assign(np.zeros(K))
        for s in self.slots:
            s.assign(tf.zeros_like(s))
        self.t.assign(0.0)
        self.lr.assign(lr)

    def _train_step(self, x, pi, mask):
        with tf.GradientTape() as tape:
            logits = tf.matmul(x, self.w) + self.b
            if self.model == "A":
                loss, info = ops.possibilistic_projection_loss(
                    pi, logits, PAPER_CONFIG, return_info=True
                )
                cycles = info.cycles
            else:
                loss = ops.antipignistic_kl_loss(pi, logits)
                cycles = tf.zeros_like(mask, tf.int32)
            loss = tf.reduce_sum(loss * mask) / tf.reduce_sum(mask)
        grads = tape.gradient(loss, [self.w, self.b])
        self.t.assign_add(1.0)
        b1, b2, eps, wd = 0.9, 0.999, 1e-8, 1e-4
        for var, g, (m, v) in zip([self.w, self.b], grads, [self.slots[:2], self.slots[2:]]):
            g = g + wd * var  # PyTorch Adam(weight_decay): coupled L2
            m.assign(b1 * m + (1 - b1) * g)
            v.assign(b2 * v + (1 - b2) * g * g)
            mhat = m / (1 - b1**self.t)
            vhat = v / (1 - b2**self.t)
            var.assign_sub(self.lr * mhat / (tf.sqrt(vhat) + eps))
        return loss, cycles

    def fit(self, rng, x, pi, epochs):
        n = len(x)
        for _ in range(epochs):
            perm = rng.permutation(n)
            for s in range(0, n, self.batch):
                idx = perm[s : s + self.batch]
                pad = self.batch - len(idx)  # pad the last batch with weight-0 rows
                xb = np.concatenate([x[idx], np.zeros((pad, x.shape[1]))])
                pb = np.concatenate([pi[idx], np.ones((pad, K))])
                mb = np.concatenate([np.ones(len(idx)), np.zeros(pad)])
                _, cyc = self._step(tf.constant(xb), tf.constant(pb), tf.constant(mb))
                if self.model == "A":
                    self.cycles.extend(cyc.numpy()[: len(idx)].tolist())

    def accuracy(self, x, c):
        pred = np.argmax(x @ self.w.numpy() + self.b.numpy(), axis=1)
        return float(np.mean(pred == c))


def run_once(trainers, seed, d, alpha, n_tr, model, lr, epochs=None):
    rng = np.random.default_rng(seed)
    mu, (xtr, ctr), (xva, cva), (xte, cte) = make_data(rng, d, n_tr)
    pi = staircase(rng, xtr, ctr, mu, alpha)
    batch, paper_epochs = (64, 80) if n_tr <= 200 else (128, 60)
    epochs = epochs or paper_epochs
    key = (d, batch, model)
    if key not in trainers:
        trainers[key] = LinearTrainer(d, batch, model)
    tr = trainers[key]
    init_rng = np.random.default_rng(seed + 7919)
    tr.reset(init_rng, lr)
    tr.fit(init_rng, xtr, pi, epochs)
    return tr.accuracy(xva, cva), tr.accuracy(xte, cte)


def plot_accuracies(rows, runs, png):
    """Bar chart of the test accuracies of Models A and B per configuration (paper: crosses).

    ``rows`` are ``(d, alpha, N, lr_A, lr_B, accs_A, accs_B)``; the y-axis spans [0, 1].
    Saves the figure to ``png`` (and closes it), or returns it when ``png`` is None.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(max(6, 1.5 * len(rows) + 1), 3.8))
    labels = [f"d={r[0]}\na={r[1]}\nN={r[2]}" for r in rows]
    xs = np.arange(len(rows))

    def sd(values):
        return np.std(values, ddof=1) if len(values) > 1 else 0.0

    ax.bar(
        xs - 0.2,
        [np.mean(r[5]) for r in rows],
        0.4,
        yerr=[sd(r[5]) for r in rows],
        label="A: projection",
    )
    ax.bar(
        xs + 0.2,
        [np.mean(r[6]) for r in rows],
        0.4,
        yerr=[sd(r[6]) for r in rows],
        label="B: antipignistic",
    )
    ax.scatter(
        xs - 0.2, [PAPER[r[:3]][2] for r in rows], marker="x", color="k", zorder=3, label="paper"
    )
    ax.scatter(xs + 0.2, [PAPER[r[:3]][4] for r in rows], marker="x", color="k", zorder=3)
    ax.set_xticks(xs, labels)
    ax.set_ylabel("test accuracy")
    ax.set_ylim(0.0, 1.0)  # from 0: a weak model (accuracy 0.26, say) keeps its bar
    ax.legend(loc="upper left", fontsize=8, ncol=3)
    bars = "error bars: sd over runs" if runs > 1 else "one run each"
    ax.set_title(f"Synthetic study: test accuracy, Model A vs B ({bars}; x: paper)", fontsize=10)
    fig.tight_layout()
    if png is None:
        return fig
    fig.savefig(png, dpi=120)
    plt.close(fig)
    return None


def main(argv=None):
    parser = build_parser()
    args = parser.parse_args(argv)
    epochs = None
    if args.smoke:
        configs = [(30, 0.40, 200)]
        grid_a, grid_b = [PAPER[configs[0]][0]], [PAPER[configs[0]][1]]
        val_seeds, runs, epochs = 1, args.runs or 1, 2
    elif args.full:
        configs = sorted(PAPER)
        grid_a = [m * 10.0**e for e in (-4, -3, -2) for m in range(1, 10)]
        grid_b, val_seeds, runs = grid_a, 3, args.runs or 10
    else:
        configs = [(30, 0.40, 200), (30, 0.95, 200), (30, 0.40, 1000), (30, 0.95, 1000)]
        grid_a, grid_b = [0.004, 0.01, 0.02], [0.0003, 0.0008, 0.002]
        val_seeds, runs = 1, args.runs or 3
    args.runs = runs
    out = _common.output_dir(args.out, SCRIPT)
    trainers, rows = {}, []
    t0 = time.time()
    for d, alpha, n_tr in configs:
        best = {}
        bar = _common.RunProgress(
            f"d={d} alpha={alpha} N={n_tr}: learning-rate grid, then {runs} run(s) per model",
            (len(grid_a) + len(grid_b)) * val_seeds + 2 * runs,
            metrics=("acc",),
            unit_name="fit",
        )
        for model, grid in (("A", grid_a), ("B", grid_b)):
            scores = []
            for lr in grid:
                val = []
                for s in range(val_seeds):
                    val.append(run_once(trainers, 10_000 + s, d, alpha, n_tr, model, lr, epochs)[0])
                    bar.update({"acc": val[-1]})
                scores.append(np.mean(val))
                if args.verbose:
                    print(
                        f"[{time.time() - t0:6.0f}s] d={d} alpha={alpha} N={n_tr} model "
                        f"{model} lr={lr:g}: val acc {np.mean(val):.4f}",
                        flush=True,
                    )
            best[model] = grid[int(np.argmax(scores))]
        accs = {}
        for m in ("A", "B"):
            accs[m] = []
            for s in range(runs):
                accs[m].append(run_once(trainers, s, d, alpha, n_tr, m, best[m], epochs)[1])
                bar.update({"acc": accs[m][-1]})
        rows.append((d, alpha, n_tr, best["A"], best["B"], accs["A"], accs["B"]))
        if args.verbose:
            print(
                f"[{time.time() - t0:6.0f}s] d={d} alpha={alpha} N={n_tr}: "
                f"A {np.mean(accs['A']):.4f} B {np.mean(accs['B']):.4f}",
                flush=True,
            )
    cyc = np.array(sum((t.cycles for key, t in trainers.items() if key[2] == "A"), []))
    write_results(args, rows, cyc, time.time() - t0, out, argv)


def write_results(args, rows, cycles, seconds, out, argv=None):
    fmt = _common.fmt_stat
    lines = [
        f"Command: `{_common.command_line(SCRIPT, argv)}`",
        "",
        f"Runtime {seconds / 60:.1f} min on 2 shared CPU cores. Test accuracy over "
        f"{args.runs} final run(s) per configuration (mean ± sd when more than one); the "
        "paper's Table 5 (10 runs, mean ± sd) in parentheses.",
        "",
        "| d | alpha | N_tr | lr_A (paper) | lr_B (paper) | Acc_A (paper) | Acc_B (paper) "
        "| A - B |",
        "|---|---|---|---|---|---|---|---|",
    ]
    wins = 0
    for d, alpha, n_tr, la, lb, acc_a, acc_b in rows:
        p = PAPER[(d, alpha, n_tr)]
        diff = np.mean(acc_a) - np.mean(acc_b)
        wins += diff > 0
        lines.append(
            f"| {d} | {alpha:.2f} | {n_tr} | {la:g} ({p[0]:g}) | {lb:g} ({p[1]:g}) | "
            f"{fmt(acc_a)} ({p[2]:.4f} ± {p[3]:.4f}) | "
            f"{fmt(acc_b)} ({p[4]:.4f} ± {p[5]:.4f}) | {diff:+.4f} |"
        )
    lines += [
        "",
        f"Model A has the higher mean test accuracy in {wins} of {len(rows)} "
        "configurations (paper: 35 of 36).",
    ]
    if args.runs == 1:
        lines.append(_common.seeds_note(1))
    if len(cycles):
        lines.append(
            f"Dykstra cycles per training example (Model A, paper rule, tol 1e-8): "
            f"mean {cycles.mean():.1f}, p90 {np.percentile(cycles, 90):.0f}, "
            f"max {cycles.max()}, over {len(cycles)} projections."
        )
    name = SCRIPT + ("_full" if args.full else "_smoke" if args.smoke else "_quick")
    print("\n".join(lines))
    _common.wrote(out / f"{name}.md").write_text("\n".join(lines) + "\n")
    png = out / f"{name}.png"
    plot_accuracies(rows, args.runs, png)
    _common.wrote(png)


if __name__ == "__main__":
    main()
