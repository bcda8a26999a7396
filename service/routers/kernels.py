"""GET /kernels: the families and their parameter spaces, read from the registry."""

from __future__ import annotations

import functools

from fastapi import APIRouter

from kernels import REGISTRY
from service.models import KernelPublic, KernelsPublic

router = APIRouter(prefix="/kernels", tags=["kernels"])


@functools.cache
def _described() -> KernelsPublic:
    data = [KernelPublic.model_validate(family.describe()) for family in REGISTRY.values()]
    return KernelsPublic(data=data, count=len(data))


@router.get("", response_model=KernelsPublic)
async def list_kernels() -> KernelsPublic:
    """Every kernel family: name, summary, source, and each parameter's values, default and condition."""
    return _described()
