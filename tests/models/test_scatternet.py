"""ScatterNet (kymatio's 2-D scattering transform, J = 2, L = 8) under a linear or CNN head: the 2-D
front end imports without kymatio's 3-D code, feature shapes and layout, cached deterministic
features, and one private step of each head with Opacus's hooks and with book-keeping."""

import copy
import functools
import importlib.util
import subprocess
import sys
import textwrap

import pytest
import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, TensorDataset

from dpnoise.models import MODELS, FeatureClassifier, build_model, count_trainable_parameters, extract_features
from dpnoise.models.errors import InvalidModelError, ModelNotAvailableError

needs_kymatio = pytest.mark.skipif(importlib.util.find_spec("kymatio") is None,
                                   reason="kymatio not installed (pip install 'kymatio>=0.3,<0.4')")
SHAPES = {(1, 28): (81, 7, 7), (3, 32): (243, 8, 8)}  # (image channels, side) -> feature shape


@functools.cache
def shared_model(head: str, channels: int, side: int) -> nn.Module:
    """One model per configuration for the tests that only read it (building the filters takes ~0.2 s)."""
    return build_model(f"scatternet-{head}", in_channels=channels, input_size=side)


def images(channels: int, side: int, n: int = 6) -> torch.Tensor:
    return torch.rand(n, channels, side, side, generator=torch.Generator().manual_seed(channels * side))


def test_scatternet_models_are_registered():
    assert {"scatternet-linear", "scatternet-cnn"} <= set(MODELS)


@needs_kymatio
def test_2d_front_end_imports_without_kymatio_3d_code():
    """In a fresh interpreter: our wrapper runs the 2-D transform and loads neither ``kymatio.torch`` nor
    the 3-D filter bank, whose ``scipy.special.sph_harm`` import is why ``kymatio.torch`` fails on SciPy >= 1.17."""
    script = textwrap.dedent("""
        import sys
        import scipy.special
        import torch
        from dpnoise.models.kymatio_scattering import TORCH_FRONTEND_2D, scattering2d, scattering2d_class
        cls = scattering2d_class()
        assert (cls.__module__, cls.__name__) == (TORCH_FRONTEND_2D, "ScatteringTorch2D"), cls
        out = scattering2d((28, 28), J=2, L=8)(torch.rand(2, 28, 28))
        assert out.shape == (2, 81, 7, 7), out.shape
        loaded = [m for m in ("kymatio.torch", "kymatio.scattering3d.filter_bank",
                              "kymatio.scattering3d.frontend.torch_frontend") if m in sys.modules]
        assert not loaded, loaded
        try:
            import kymatio.torch
        except ImportError:
            top_level_import = "fails"
        else:
            top_level_import = "works"
        print(top_level_import, hasattr(scipy.special, "sph_harm"))
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    top_level_import, has_sph_harm = done.stdout.split()
    # the reason for the wrapper: kymatio.torch fails exactly where SciPy has no sph_harm
    assert top_level_import == ("works" if has_sph_harm == "True" else "fails")


def test_missing_kymatio_names_the_install_command(monkeypatch):
    from dpnoise.models.kymatio_scattering import TORCH_FRONTEND_2D

    monkeypatch.setitem(sys.modules, TORCH_FRONTEND_2D, None)  # import fails as if not installed
    with pytest.raises(ModelNotAvailableError, match="pip install 'kymatio>=0.3,<0.4'"):
        build_model("scatternet-linear")


@needs_kymatio
@pytest.mark.parametrize(("channels", "side"), list(SHAPES))
def test_feature_shapes_and_determinism(channels, side):
    model = shared_model("linear", channels, side)
    assert isinstance(model, FeatureClassifier)
    x = images(channels, side, 3)
    features = model.features(x)
    assert features.shape == (3, *SHAPES[channels, side]) == (3, *model.scattering.output_shape)
    assert torch.equal(features, model.features(x.clone()))
    assert torch.equal(features[1:2], model.features(x[1:2]))  # each image's features are its own
    assert model(x).shape == model(features).shape == (3, 10)
    with pytest.raises(InvalidModelError, match="normalize=False"):
        model.features(x - 0.5)
    with pytest.raises(InvalidModelError, match="expected images"):
        model.features(images(channels, side + 4, 1))


@needs_kymatio
@pytest.mark.parametrize(("channels", "side"), list(SHAPES))
def test_constant_images_keep_only_the_normalised_average(channels, side):
    """Order 0 is a low-pass average of the (ImageNet-standardised, for RGB) pixels; a constant image
    has no first- or second-order energy.  Image channel c owns feature channels 81c..81c+80."""
    model = shared_model("linear", channels, side)
    features = model.features(torch.full((1, channels, side, side), 0.5)).view(channels, 81, -1)
    expected = [(0.5 - m) / s for m, s in zip((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))] if channels == 3 else [0.5]
    torch.testing.assert_close(features[:, 0], torch.tensor(expected).view(-1, 1).expand_as(features[:, 0]),
                               rtol=1e-4, atol=1e-4)
    assert features[:, 1:].abs().max() < 1e-6


@needs_kymatio
def test_features_are_cached_once_per_dataset_and_shared_by_both_heads(monkeypatch, tmp_path):
    monkeypatch.setenv("DPNOISE_CACHE", str(tmp_path))
    data = TensorDataset(images(1, 28, 5), torch.arange(5))
    linear, cnn = build_model("scatternet-linear"), build_model("scatternet-cnn")
    calls = []
    for model in (linear, cnn):
        model.scattering.register_forward_hook(lambda module, inputs, output: calls.append(len(inputs[0])))
    first = extract_features(linear, data, batch_size=2)
    assert calls == [2, 2, 1]
    (cached,) = (tmp_path / "features").glob("*.pt")
    assert cached.name.startswith("scatternet-J2-L8-1x28-")
    again, from_cnn = extract_features(linear, data), extract_features(cnn, data)
    assert calls == [2, 2, 1]  # read back, not recomputed
    assert torch.equal(again.tensors[0], first.tensors[0]) and torch.equal(from_cnn.tensors[0], first.tensors[0])
    assert first.tensors[0].shape == (5, 81, 7, 7) and torch.equal(first.tensors[1], torch.arange(5))
    # computed features equal the cached ones (float16 precision, as every frozen-feature model)
    assert torch.equal(first.tensors[0], linear.features(data.tensors[0]).half().float())


@needs_kymatio
@pytest.mark.filterwarnings("ignore:Full backward hook is firing")
@pytest.mark.parametrize("head", ["linear", "cnn"])
@pytest.mark.parametrize(("channels", "side"), list(SHAPES))
def test_heads_take_one_private_step_with_hooks_and_bookkeeping(head, channels, side):
    from dpnoise.training import make_private

    model = shared_model(head, channels, side)
    fresh_head = copy.deepcopy(model.head)
    assert not [m for m in model.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]
    assert count_trainable_parameters(model) == count_trainable_parameters(model.head)  # ScatterNet is frozen
    features, labels = model.features(images(channels, side, 8)), torch.arange(8) % 10
    # plain forward / backward through the whole classifier
    model.zero_grad()
    F.cross_entropy(model(features), labels).backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in model.head.parameters())
    model.zero_grad()
    trained = {}
    for mode in ("hooks", "bookkeeping"):
        head_module = copy.deepcopy(fresh_head)  # the same initial weights for both routes
        before = [p.detach().clone() for p in head_module.parameters()]
        loader = DataLoader(TensorDataset(features, labels), batch_size=4)
        module, optimizer, private_loader = make_private(
            head_module, torch.optim.SGD(head_module.parameters(), lr=0.5), loader, mechanism="gaussian",
            noise_multiplier=0.5, max_grad_norm=0.1, delta=1e-5, seed=3, noise_seed=3, grad_sample_mode=mode)
        batch_features, batch_labels = next(iter(private_loader))  # the same draw for both routes (noise_seed)
        optimizer.zero_grad()
        F.cross_entropy(module(batch_features), batch_labels).backward()
        optimizer.step()
        assert optimizer.privacy_engine.steps == 1 and optimizer.privacy_engine.grad_sample_mode == mode
        trained[mode] = [p.detach().clone() for p in head_module.parameters()]
        assert all(not torch.equal(a, b) for a, b in zip(before, trained[mode]))
    # same seed and batch: the two per-example gradient routes give the same clipped, noised step
    for with_hooks, with_bookkeeping in zip(trained["hooks"], trained["bookkeeping"]):
        torch.testing.assert_close(with_hooks, with_bookkeeping, rtol=1e-4, atol=1e-5)


@needs_kymatio
def test_head_options_are_checked():
    assert build_model("scatternet-linear", num_groups=81).head.norm.num_groups == 81
    with pytest.raises(InvalidModelError, match="num_groups"):
        build_model("scatternet-cnn", num_groups=10)
    with pytest.raises(InvalidModelError, match="grayscale or RGB"):
        build_model("scatternet-linear", in_channels=2)
    with pytest.raises(InvalidModelError, match="side >= 4"):
        build_model("scatternet-linear", input_size=3)
