"""The text of a trace file, in bounded pieces: plain or gzip, UTF-8 only, at most MAX_TEXT_BYTES of it.

Everything that can go wrong below the JSON level is one sentence here (a UserError): not a regular file,
unreadable, compressed by something other than gzip, a gzip that is cut short or corrupt, a gzip that
expands past the limit (a "zip bomb" of whitespace used to run for minutes), text that is not UTF-8 or is
UTF-16/32 (its byte-order mark says so). A UTF-8 byte-order mark is dropped, as RFC 8259 allows.

Memory: one raw chunk (CHUNK_BYTES) and what zlib inflates from it, at most `want` bytes per call (zlib's
max_length), so a small compressed chunk cannot inflate into gigabytes at once.
Progress: files over PROGRESS_BYTES of text (a .gz by its trailer's size) show a rich progress bar on stderr
(a terminal only), counted in bytes of the file itself, so the bar reaches its end with the file.
The trailer is a hint only (the last member's size modulo 4 GiB, and garbage in a cut file): the count of
inflated bytes in `read` is what holds the limit.
"""

from __future__ import annotations

import codecs
import zlib
from pathlib import Path
from typing import Any, BinaryIO

from simulator.errors import UserError

CHUNK_BYTES = 1 << 20
MAX_TEXT_BYTES = 512 << 20  # JSON text read at most (after gunzip): ~35 s at the measured ~16 MB/s of parsing
PROGRESS_BYTES = 50_000_000
GZIP_MAGIC = b"\x1f\x8b"
OTHER_FORMATS = {  # leading bytes of files that are not JSON text, and what they are
    b"\x28\xb5\x2f\xfd": "zstd-compressed", b"BZh": "bzip2-compressed", b"\xfd7zXZ\x00": "xz-compressed",
    b"PK\x03\x04": "a zip archive", b"\x89PNG": "a PNG image", b"\x7fELF": "an executable (ELF)",
    b"SQLite format 3": "an SQLite database (an Nsight Systems .sqlite export? export it to JSON)",
    b"\x00\x00\xfe\xff": "UTF-32 text", b"\xff\xfe\x00\x00": "UTF-32 text",
    b"\xfe\xff": "UTF-16 text", b"\xff\xfe": "UTF-16 text",
}


def _mib(n: float) -> str:
    return f"{n / (1 << 20):,.0f} MiB" if n >= 1 << 20 else f"{n:,.0f} bytes"


def _open(path: Path) -> BinaryIO:
    try:
        return path.open("rb")
    except OSError as exc:
        raise UserError(f"{path} cannot be opened ({exc.strerror or type(exc).__name__}).") from None


def _ends(path: Path) -> tuple[bytes, bytes]:
    """The file's first 16 and last 4 bytes (what it is; a gzip's stated size)."""
    with _open(path) as f:
        head = f.read(16)
        f.seek(-min(4, len(head)), 2)
        return head, f.read(4)


class TextSource:
    """Pieces of a trace file's text: `read(n)` returns up to about n characters, '' at the end."""

    def __init__(self, path: Path, console: Any = None) -> None:
        self.path, self.progress = path, None
        if path.is_dir():
            raise UserError(f"{path} is a directory, not a trace file.")
        if not path.exists():
            raise UserError(f"{path} does not exist.")
        if not path.is_file():
            raise UserError(f"{path} is not a regular file (a device, a pipe or a socket), so it is not a trace.")
        self.size = path.stat().st_size
        if self.size == 0:
            raise UserError(f"{path} is empty.")
        head, tail = _ends(path)
        self.gzip = head.startswith(GZIP_MAGIC)
        if not self.gzip:
            self._refuse_format(head)
            if self.size > MAX_TEXT_BYTES:
                raise UserError(f"{path} is {_mib(self.size)}, over the {_mib(MAX_TEXT_BYTES)} of trace text "
                                "moe-sim reads; profile fewer decode steps.")
        # a .gz's trailer states its (last member's) text size modulo 4 GiB: whether to draw the bar, not a
        # limit (a cut or hostile file's last four bytes can say anything; `read` counts what is inflated)
        expands = max(self.size, int.from_bytes(tail, "little") if self.gzip and self.size >= 18 else 0)
        self.inflate = zlib.decompressobj(wbits=31) if self.gzip else None  # 31: gzip header and trailer
        self.pending = b""  # compressed bytes not yet inflated
        self.text_bytes = 0
        self.decoder = codecs.getincrementaldecoder("utf-8")()
        self.first = True
        self.raw = _open(path)
        if expands > PROGRESS_BYTES:  # the bar counts the file's own bytes, but what takes time is the text
            self.progress = _Progress(path, self.size, console)

    def close(self) -> None:
        self.raw.close()
        if self.progress:
            self.progress.close()

    def read(self, want: int) -> str:
        """Up to `want` bytes of the file's text, decoded; '' at the end of the file."""
        while True:
            data = self._inflate(want) if self.gzip else self._raw_read(want)
            if self.first and data:
                if self.gzip:
                    self._refuse_format(data[:16], inside=" inside its gzip")
                data = data.removeprefix(codecs.BOM_UTF8)
                self.first = False
            self.text_bytes += len(data)
            if self.text_bytes > MAX_TEXT_BYTES:
                raise UserError(f"{self.path} expands past {_mib(MAX_TEXT_BYTES)} of text once decompressed "
                                f"(after {_mib(self.raw.tell())} of its {_mib(self.size)}), the most moe-sim "
                                "reads; profile fewer decode steps.")
            text = self._decode(data, final=not data)
            if text or not data:
                return text

    def _raw_read(self, n: int) -> bytes:
        try:
            data = self.raw.read(n)
        except OSError as exc:
            raise UserError(f"{self.path} cannot be read ({exc.strerror or type(exc).__name__}).") from None
        if self.progress:
            self.progress.update(self.raw.tell())
        return data

    def _inflate(self, want: int) -> bytes:
        """Up to `want` inflated bytes; gzip members one after another (what `cat a.gz b.gz` makes)."""
        assert self.inflate is not None
        while True:
            if not self.pending:
                self.pending = self._raw_read(CHUNK_BYTES)
                if not self.pending:
                    if not self.inflate.eof:
                        raise UserError(f"{self.path} is a gzip file cut short (it ends inside the compressed "
                                        "stream): copy or download it again.")
                    return b""
            if self.inflate.eof:  # a new gzip member starts here
                if not self.pending.startswith(GZIP_MAGIC[:len(self.pending)]):
                    raise UserError(f"{self.path} has {_mib(len(self.pending))} of data after its gzip stream "
                                    "that are not gzip.")
                self.inflate = zlib.decompressobj(wbits=31)
            try:
                out = self.inflate.decompress(self.pending, want)
            except zlib.error as exc:
                raise UserError(f"{self.path} is a corrupt gzip file ({exc}).") from None
            self.pending = self.inflate.unconsumed_tail or self.inflate.unused_data
            if out:
                return out

    def _decode(self, data: bytes, final: bool) -> str:
        try:
            return self.decoder.decode(data, final)
        except UnicodeDecodeError as exc:
            at = self.text_bytes - len(data) + exc.start
            raise UserError(f"{self.path} is not UTF-8 text (byte 0x{data[exc.start]:02x} at offset {at:,}"
                            + (" of the decompressed text" if self.gzip else "")
                            + "); a trace is UTF-8 JSON.") from None

    def _refuse_format(self, head: bytes, inside: str = "") -> None:
        for magic, what in OTHER_FORMATS.items():
            if head.startswith(magic):
                hint = "; re-save it as UTF-8" if "UTF" in what else "; moe-sim reads JSON, plain or gzip"
                raise UserError(f"{self.path} is {what}{inside} (its first bytes say so), not a JSON trace{hint}.")


class _Progress:
    """A rich progress bar over the file's bytes, on stderr, drawn only on a terminal."""

    def __init__(self, path: Path, total: int, console: Any = None) -> None:
        from rich.console import Console
        from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn
        console = console or Console(stderr=True)
        self.bar = None
        if console.is_terminal:
            self.bar = Progress(TextColumn(f"reading {path.name}"), BarColumn(), DownloadColumn(),
                                TimeRemainingColumn(), console=console, transient=True)
            self.task = self.bar.add_task("read", total=total)
            self.bar.start()

    def update(self, done: int) -> None:
        if self.bar is not None:
            self.bar.update(self.task, completed=done)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.stop()
