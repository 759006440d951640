"""Lists of results that show themselves as tables: ``to_frame()`` and ``_repr_html_()``.

``whichgpu.fit``, ``predict``, ``bench`` and ``gpus`` return a ``ResultList``: a ``list`` in
every way (index it, loop over it, compare it with a list), plus

- ``to_frame()``: a pandas DataFrame, one row per result (needs pandas, the ``report`` extra);
- ``_repr_html_()``: an HTML table, which Jupyter shows when the list is a cell's value.

Nothing here imports pandas or renders anything until asked; the renderers are in
``whichgpu.report.notebook``.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, SupportsIndex, TypeVar, overload

if TYPE_CHECKING:
    from pandas import DataFrame

__all__ = ["ResultList"]

_T = TypeVar("_T")


class ResultList(list[_T]):
    """A list of results (estimates, measurements, catalog GPUs) that renders as a table.

    Slicing keeps the type, so ``whichgpu.gpus()[:5]`` still shows as a table.

    ``notes`` says what the list leaves out that the question could have covered (a
    whole-catalog ``predict`` names the GPUs it cannot time), so an absence is never silent.
    """

    notes: tuple[str, ...]

    def __init__(self, items: Iterable[_T] = (), *, notes: Iterable[str] = ()) -> None:
        super().__init__(items)
        self.notes = tuple(notes)

    @overload
    def __getitem__(self, index: SupportsIndex) -> _T: ...

    @overload
    def __getitem__(self, index: slice) -> ResultList[_T]: ...

    def __getitem__(self, index: SupportsIndex | slice) -> _T | ResultList[_T]:
        if isinstance(index, slice):
            return ResultList(super().__getitem__(index), notes=self.notes)
        return super().__getitem__(index)

    def to_frame(self) -> DataFrame:
        """One row per result, one column per scalar field (needs pandas)."""
        from whichgpu.report.notebook import list_frame

        return list_frame(self)

    def _repr_html_(self) -> str:
        from whichgpu.report.notebook import list_html

        return list_html(self)
