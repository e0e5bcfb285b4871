import pytest
import torch
from conftest import TINY, make_vit
from einops import rearrange

from vit_explorer import VitExplorerError
from vit_explorer.core.capture import AttentionRecorder, record_attention, record_attention_gradients


def manual_attention(model, images):
    """softmax(q·kᵀ·scale) recomputed layer by layer from each layer's own weights: [b, layers, heads, n, n]."""
    maps = []
    with torch.no_grad():
        x = model.to_patch_embedding(images)
        x = torch.cat((model.cls_token.expand(images.shape[0], *model.cls_token.shape), x), dim=1)
        x = x + model.pos_embedding[: x.shape[1]]
        for attention, feed_forward in model.transformer.layers:
            normed = attention.norm(x)
            q, k, _ = (rearrange(t, "b n (h d) -> b h n d", h=attention.heads) for t in attention.to_qkv(normed).chunk(3, -1))
            maps.append(torch.softmax(q @ k.transpose(-1, -2) * attention.scale, dim=-1))
            x = attention(x) + x
            x = feed_forward(x) + x
    return torch.stack(maps, dim=1)


def hook_count(model):
    return sum(len(module._forward_hooks) for module in model.modules())


@pytest.mark.parametrize("config", [TINY, {**TINY, "image_size": (64, 32)}, {**TINY, "pool": "mean"}],
                         ids=["square", "rect", "no-cls"])
def test_captured_maps_equal_manual_softmax_and_rows_sum_to_one(config):
    model = make_vit(config)
    images = torch.randn(2, 3, *model.image_size)
    logits, attentions = record_attention(model, images)
    n = model.grid_size[0] * model.grid_size[1] + model.cls_token.shape[0]
    assert attentions.shape == (2, config["depth"], config["heads"], n, n)
    torch.testing.assert_close(attentions, manual_attention(model, images), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(attentions.sum(-1), torch.ones(attentions.shape[:-1]), rtol=0, atol=1e-5)
    with torch.no_grad():
        torch.testing.assert_close(logits, model(images), rtol=0, atol=0)


def test_captured_maps_equal_vit_pytorch_recorder():
    vit_pytorch = pytest.importorskip("vit_pytorch")
    from vit_pytorch.recorder import Recorder

    torch.manual_seed(3)
    theirs = vit_pytorch.ViT(**TINY).eval()
    images = torch.randn(3, 3, 64, 64)
    with torch.no_grad():
        their_logits, their_maps = Recorder(theirs)(images)
    logits, maps = record_attention(theirs, images)
    torch.testing.assert_close(maps, their_maps, rtol=0, atol=0)
    torch.testing.assert_close(logits, their_logits, rtol=0, atol=0)


def test_hooks_are_removed_after_capture_and_after_an_exception(tiny_vit):
    record_attention(tiny_vit, torch.randn(1, 3, 64, 64))
    assert hook_count(tiny_vit) == 0
    with pytest.raises(RuntimeError):  # wrong channel count: the forward raises inside capture
        record_attention(tiny_vit, torch.randn(1, 4, 64, 64))
    assert hook_count(tiny_vit) == 0


def test_recorder_context_is_reusable_and_detaches_on_exit(tiny_vit):
    with AttentionRecorder(tiny_vit) as record:
        assert hook_count(tiny_vit) == TINY["depth"]
        _, first = record(torch.randn(1, 3, 64, 64))
        _, second = record(torch.randn(2, 3, 64, 64))
    assert hook_count(tiny_vit) == 0
    assert first.shape[0] == 1 and second.shape[0] == 2
    assert not torch.allclose(first[0], second[0])
    with pytest.raises(RuntimeError, match="outside its `with` block"):
        record(torch.zeros(1, 3, 64, 64))


def test_capture_fails_loudly_when_no_map_was_recorded(tiny_vit):
    class Bypass(torch.nn.Module):
        def forward(self, x):
            return x

    for attention, _ in tiny_vit.transformer.layers:  # attention no longer runs through the softmax modules
        attention.forward = Bypass().forward
    with pytest.raises(RuntimeError, match="captured no attention maps"):
        record_attention(tiny_vit, torch.randn(1, 3, 64, 64))


def test_unknown_module_is_a_user_error():
    with pytest.raises(VitExplorerError, match="does not know how to capture"):
        record_attention(torch.nn.Linear(3, 3), torch.randn(1, 3))


def test_keep_graph_keeps_maps_in_the_autograd_graph(tiny_vit):
    images = torch.randn(1, 3, 64, 64, requires_grad=True)
    _, attentions = record_attention(tiny_vit, images, keep_graph=True)
    (attentions[0, -1, :, 0, 1:]).sum().backward()
    assert images.grad is not None and images.grad.abs().sum() > 0
    _, frozen = record_attention(tiny_vit, images)
    assert not frozen.requires_grad


def test_attention_gradients_are_the_class_score_derivatives(tiny_vit):
    """The gradient at one entry of one map equals the finite difference of the logit when that entry moves."""
    torch.manual_seed(1)
    images = torch.randn(2, 3, 64, 64)
    targets = torch.tensor([3, 1])
    logits, attentions, gradients = record_attention_gradients(tiny_vit, images, targets)
    plain_logits, plain_attentions = record_attention(tiny_vit, images)
    torch.testing.assert_close(logits, plain_logits)
    torch.testing.assert_close(attentions, plain_attentions)
    assert not logits.requires_grad and not attentions.requires_grad and not gradients.requires_grad
    assert gradients.abs().sum() > 0 and gradients.shape == attentions.shape
    layer, head, i, j, step = 1, 2, 0, 5, 1e-3

    def nudge(_module, _inputs, output):
        output = output.clone()
        output[:, head, i, j] += step
        return output

    handle = tiny_vit.transformer.layers[layer][0].attend.register_forward_hook(nudge)
    try:
        with torch.no_grad():
            nudged = tiny_vit(images)
    finally:
        handle.remove()
    difference = (nudged - plain_logits)[torch.arange(2), targets] / step
    torch.testing.assert_close(difference, gradients[:, layer, head, i, j], rtol=1e-2, atol=1e-4)


def test_gradient_capture_leaves_the_no_grad_path_and_no_hooks_behind(tiny_vit):
    record_attention_gradients(tiny_vit, torch.randn(1, 3, 64, 64))
    assert all(not module._forward_hooks for module in tiny_vit.modules())
    _, attentions = record_attention(tiny_vit, torch.randn(1, 3, 64, 64))
    assert not attentions.requires_grad and attentions.is_inference()


def test_reused_output_is_one_tensor_overwritten_by_each_pass(tiny_vit):
    first_images, second_images = torch.randn(2, 3, 64, 64), torch.randn(2, 3, 64, 64)
    _, expected_second = record_attention(tiny_vit, second_images)
    with AttentionRecorder(tiny_vit, reuse_output=True) as record:
        _, first = record(first_images)
        first_copy = first.clone()
        _, second = record(second_images)
        assert second is first  # the same memory, now holding the second batch's maps
        torch.testing.assert_close(second, expected_second)
        assert not torch.equal(first_copy, second)
        _, single = record(second_images[:1])  # another shape: a new tensor
        assert single is not second and single.shape[0] == 1
    with AttentionRecorder(tiny_vit) as record:
        assert record(first_images)[1] is not record(first_images)[1]
    with pytest.raises(ValueError, match="reuse_output"):
        AttentionRecorder(tiny_vit, keep_graph=True, reuse_output=True)
