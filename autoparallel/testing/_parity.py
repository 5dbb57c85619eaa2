"""Comparing a parallelized model with its single-process reference: the tolerances the runtime's
parity checks use and the helpers they share (torch imported inside each function)."""

from __future__ import annotations

#: Logits, loss and gradients: the largest difference over the reference tensor's largest magnitude.
GRADIENT_TOLERANCE = 1e-5
#: Parameters after one AdamW step: absolute difference.
PARAMETER_TOLERANCE = 1e-4


def full_tensor(tensor):
    """The whole tensor of a DTensor (gathered over its mesh); any other tensor as it is."""
    from torch.distributed.tensor import DTensor

    return tensor.full_tensor() if isinstance(tensor, DTensor) else tensor


def relative_error(actual, expected) -> float:
    """Largest absolute difference over the largest magnitude of ``expected``."""
    scale = max(float(expected.abs().max()), 1e-12)
    return float((actual.detach() - expected.detach()).abs().max()) / scale


def reference_step(model, tokens, targets):
    """One single-process training step of ``model``: cross-entropy of its logits, backward, one
    AdamW step (lr 1e-3). Returns the logits and every parameter's gradient before the step."""
    import torch
    import torch.nn.functional as F

    logits = model(tokens)
    F.cross_entropy(logits.flatten(0, 1), targets.flatten()).backward()
    grads = {name: p.grad.clone() for name, p in model.named_parameters()}
    torch.optim.AdamW(model.parameters(), lr=1e-3).step()
    return logits.detach(), grads


def parameter_errors(modules, reference, reference_grads) -> dict[str, float]:
    """``grad:<name>`` (relative) and ``param:<name>`` (absolute) errors of every parameter of the
    parallelized ``modules`` against the ``reference`` model after its ``reference_step``; a
    parameter without a gradient counts as a zero gradient."""
    import torch

    errors = {}
    whole = dict(reference.named_parameters())
    for name, parameter in (item for module in modules for item in module.named_parameters()):
        grad = (
            full_tensor(parameter.grad)
            if parameter.grad is not None
            else torch.zeros(parameter.shape)
        )
        errors[f"grad:{name}"] = relative_error(grad, reference_grads[name])
        errors[f"param:{name}"] = float(
            (full_tensor(parameter.detach()) - whole[name].detach()).abs().max()
        )
    return errors


def worst_error(results: list[dict], prefix: str) -> tuple[float, str]:
    """The largest error over the ranks' ``result["errors"]`` whose key starts with ``prefix``."""
    worst = (0.0, "")
    for result in results:
        for key, value in result["errors"].items():
            if key.startswith(prefix) and value > worst[0]:
                worst = (value, key)
    return worst


def assert_parity(results: list[dict]) -> None:
    """Logits, loss and gradients within ``GRADIENT_TOLERANCE``, parameters after the step within
    ``PARAMETER_TOLERANCE``, and some rank reported logits."""
    for prefix, tolerance in (
        ("logits", GRADIENT_TOLERANCE),
        ("loss", GRADIENT_TOLERANCE),
        ("grad:", GRADIENT_TOLERANCE),
    ):
        value, key = worst_error(results, prefix)
        assert value <= tolerance, f"{key}: relative error {value:.3g} > {tolerance}"
    value, key = worst_error(results, "param:")
    assert value <= PARAMETER_TOLERANCE, (
        f"{key}: error {value:.3g} after one AdamW step > {PARAMETER_TOLERANCE}"
    )
    assert any("logits" in result["errors"] for result in results)
