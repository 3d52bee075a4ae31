"""Write a copy of a Medusa heads folder with another tree (same weights): a Cartesian tree or a calibrated
tree of another node budget, e.g. to compare trees of the same node budget with ``hf-speculative bench``.

    python examples/medusa_trees.py --heads model_cards/medusa-smollm2-135m-instruct --cartesian 4,2,2 --out outputs/medusa-cart
    python examples/medusa_trees.py --heads model_cards/medusa-smollm2-135m-instruct --calibrated-nodes 12 --out outputs/medusa-cal12
"""

import argparse

from transformers import AutoModel

import hf_speculative as hfs


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--heads", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--cartesian", default=None, help="branching per depth, e.g. 4,2,2")
    p.add_argument("--calibrated-nodes", type=int, default=None, help="rebuild from the stored head accuracies")
    args = p.parse_args()
    heads = AutoModel.from_pretrained(args.heads)
    if args.cartesian:
        tree = hfs.TreeSpec.cartesian([int(b) for b in args.cartesian.split(",")])
    else:
        tree = hfs.TreeSpec.optimize(heads.config.calibration["head_top_i_accuracy"], args.calibrated_nodes)
    heads.config.medusa_choices = tree.to_list()
    heads.save_pretrained(args.out)
    print(f"{args.out}: {tree.num_nodes} nodes, depth {tree.depth}")


if __name__ == "__main__":
    main()
