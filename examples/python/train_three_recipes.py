"""Train the GPT under three recipes from Python and plot the validation curves (matplotlib if
installed, else a table). Run: python examples/python/train_three_recipes.py [out_dir]"""

import os
import sys

import scalify

out = sys.argv[1] if len(sys.argv) > 1 else "runs/python_three"
curves: dict[str, list[tuple[int, float]]] = {}
for recipe in ("f32", "scalify_fp8_3", "nvfp4"):
    run = scalify.train(os.path.join(out, recipe), recipe=recipe, steps=200,
                        progress=lambda step, steps, loss: print(f"\r{recipe}: step {step}/{steps} loss {loss:.3f}", end=""),
                        d_model=64, layers=2, heads=2, seq=64, batch=16, eval_every=25, eval_windows=128)
    print()
    curves[recipe] = [(m["step"], m["val_loss"]) for m in run["metrics"] if "val_loss" in m]

try:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    for recipe, points in curves.items():
        plt.plot(*zip(*points), label=recipe, marker="o")
    plt.xlabel("step")
    plt.ylabel("validation loss (nats)")
    plt.legend()
    plt.savefig(os.path.join(out, "val_loss.png"), dpi=120)
    print("wrote", os.path.join(out, "val_loss.png"))
except ImportError:
    for recipe, points in curves.items():
        print(recipe, " ".join(f"{s}:{v:.3f}" for s, v in points))
