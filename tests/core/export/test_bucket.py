"""Bucket packing and the copy helper that export uses for every byte it moves."""

from __future__ import annotations

import torch

from graft.export.bucket import SEPARATE_COPY_BYTES, Bucket, copy_tensors


def _sources() -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    just_large = SEPARATE_COPY_BYTES // 4  # fp32 elements of exactly the threshold
    shapes_dtypes = [((7,), torch.float32), ((just_large,), torch.float32), ((3, 5), torch.bfloat16),
                     ((just_large + 1,), torch.float32), ((2, just_large), torch.bfloat16)]
    return [torch.randn(shape, generator=generator).to(dtype) for shape, dtype in shapes_dtypes]


def test_copy_tensors_copies_small_and_large_tensors_exactly() -> None:
    sources = _sources()
    targets = [torch.zeros_like(source) for source in sources]
    copy_tensors(targets, sources)
    for target, source in zip(targets, sources, strict=True):
        assert torch.equal(target, source)


def test_bucket_views_hold_deferred_and_direct_copies() -> None:
    sources = _sources()
    bucket = Bucket(sum(s.numel() * s.element_size() for s in sources) + 64 * len(sources),
                    torch.device("cpu"))
    for index, source in enumerate(sources):
        assert bucket.add(f"t{index}", source, defer=index % 2 == 0)
    views = bucket.views()
    assert [name for name, _ in views] == [f"t{i}" for i in range(len(sources))]
    for (_, view), source in zip(views, sources, strict=True):
        assert view.dtype == source.dtype and torch.equal(view, source)
    assert not bucket.add("too big", torch.zeros(bucket.capacity))
