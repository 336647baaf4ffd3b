"""Training modes for a VLA's pretrained backbone: frozen, LoRA (peft) or full fine-tune.

The mode applies to ``model.backbone_modules()`` (the pretrained vision / VLM parts). The
policy-specific parts (fusion, action expert) always train in supervised fine-tuning, and
``always_frozen_modules()`` (e.g. the sentence encoder) never train. ``freeze(model)`` stops
everything from training: what the RL modules do to the VLA they steer.
"""

from __future__ import annotations

from torch import nn

MODES = ("frozen", "lora", "full")
"""What ``apply_mode`` accepts (``vla.models.base.VLA.set_mode`` calls it); ``vla.train_config``
keeps a torch-free copy for the command line."""


def _freeze(m: nn.Module) -> None:
    for p in m.parameters():
        p.requires_grad_(False)


def apply_mode(model, mode: str, lora_rank: int = 8, lora_alpha: int = 16,
               lora_targets: tuple[str, ...] | str | None = None) -> None:
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    if getattr(model, "_lora_injected", False) and mode != "lora":
        raise ValueError(f"this model already carries LoRA adapters; it cannot switch to mode {mode!r} "
                         "(merge them first with merge_lora)")
    for p in model.parameters():
        p.requires_grad_(True)
    for m in model.always_frozen_modules().values():
        _freeze(m)
    backbones = model.backbone_modules()
    if mode == "frozen":
        for m in backbones.values():
            _freeze(m)
    elif mode == "lora":
        targets = lora_targets if lora_targets is not None else model.lora_targets
        if not targets:
            raise ValueError("LoRA mode needs target modules (lora_targets): none given and the backbone has no default")
        if not getattr(model, "_lora_injected", False):
            from peft import LoraConfig, inject_adapter_in_model

            cfg = LoraConfig(r=lora_rank, lora_alpha=lora_alpha, lora_dropout=0.0,
                             target_modules=list(targets) if not isinstance(targets, str) else targets)
            for name, m in backbones.items():
                try:
                    inject_adapter_in_model(cfg, m)
                except ValueError as e:  # peft: "Target modules ... not found in the base model"
                    raise ValueError(f"LoRA targets {targets!r} match nothing in backbone '{name}': {e}") from None
            model._lora_injected = True
            model.lora_config = {"rank": lora_rank, "alpha": lora_alpha,
                                 "targets": targets if isinstance(targets, str) else list(targets)}
        for m in backbones.values():
            for n, p in m.named_parameters():
                p.requires_grad_("lora_" in n)
    model.mode = mode


def freeze(model: nn.Module) -> nn.Module:
    """Nothing in ``model`` trains any more, and it is put in eval mode (no dropout / BN updates)."""
    _freeze(model)
    model.eval()
    return model


def count_parameters(model: nn.Module) -> dict[str, int]:
    total = sum(p.numel() for p in model.parameters())
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    return {"total": total, "trainable": trainable}


def merge_lora(model) -> None:
    """Fold the LoRA adapters into their base layers (W <- W + scale * B A) and remove them:
    the model is then a plain ``full``-mode model with the same function (for export or a mode
    change)."""
    from peft.tuners.lora import LoraLayer

    if not getattr(model, "_lora_injected", False):
        raise ValueError("this model carries no LoRA adapters")
    for root in model.backbone_modules().values():
        for name, mod in list(root.named_modules()):
            if isinstance(mod, LoraLayer):
                mod.merge()
                parent = root.get_submodule(name.rsplit(".", 1)[0]) if "." in name else root
                setattr(parent, name.rsplit(".", 1)[-1], mod.get_base_layer())
    model._lora_injected = False
    model.lora_config = None
    apply_mode(model, "full")
