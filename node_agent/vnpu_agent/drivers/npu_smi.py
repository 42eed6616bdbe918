"""`npu-smi`: drives the Ascend CLI and parses its output (npu_smi_parse.py).

Chips come from `npu-smi info -m` (read once: the hardware does not change
while the agent runs); resources and vNPUs from `info -t info-vnpu` per chip,
health from `info -t health`, templates from `info -t template-info -i card`
(cached per card). Without a Chip Phy-ID column in `info -m`, the physical id
is taken to equal the logic id, which holds on hosts that see all their chips.

npu-smi gives no reason for a refused create or destroy beyond a message, so
on failure the chip is queried to name the cause (see diagnose.py).
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Mapping, Sequence

from vnpu_agent.drivers import npu_smi_parse as parse
from vnpu_agent.drivers.base import (
    ANY_VNPU_ID,
    VNPU,
    ChipInfo,
    DriverFailure,
    MalformedOutputError,
    NotFoundError,
    TemplateSpec,
)
from vnpu_agent.drivers.catalog import id_range, ids_per_chip_for, normalize_model
from vnpu_agent.drivers.diagnose import (
    check_vnpu_id,
    classify,
    describe_create,
    diagnose_create,
    diagnose_destroy,
    error_for_code,
)

DEFAULT_TIMEOUT = 30.0


class NpuSmiDriver:
    name = "npu-smi"

    def __init__(
        self,
        executable: str = "npu-smi",
        *,
        timeout: float = DEFAULT_TIMEOUT,
        env: Mapping[str, str] | None = None,
    ) -> None:
        """`env`: extra environment variables for npu-smi."""
        self.executable = executable
        self.timeout = timeout
        self._env = {**os.environ, **env} if env else None
        self._chips: list[parse.ChipEntry] | None = None
        self._templates: dict[int, list[TemplateSpec]] = {}

    # ------------------------------------------------------------------ queries

    def list_chips(self) -> list[ChipInfo]:
        return [self._chip_info(entry) for entry in self._topology()]

    def list_templates(self, chip: int) -> list[TemplateSpec]:
        card = self._entry(chip).card_id
        if card not in self._templates:
            text = self._query(["info", "-t", "template-info", "-i", str(card)], "list templates")
            self._templates[card] = parse.parse_template_info(text)
        return list(self._templates[card])

    def list_vnpus(self, chip: int) -> list[VNPU]:
        table = self._vnpu_table(self._entry(chip))
        return [VNPU(id=r.id, chip=chip, template=r.template, in_use=r.in_use) for r in table.vnpus]

    def config_recover_enabled(self) -> bool:
        text = self._query(["info", "-t", "vnpu-cfg-recover"], "query config-recover mode")
        return parse.parse_recover_mode(text)

    # ------------------------------------------------------------------ changes

    def create_vnpu(self, chip: int, template: str, vnpu_id: int) -> VNPU:
        entry = self._entry(chip)
        what = describe_create(chip, template, vnpu_id)
        args = ["set", "-t", "create-vnpu", "-i", str(entry.card_id), "-c", str(entry.device_id)]
        args += ["-f", template]
        before: set[int] = set()
        if vnpu_id == ANY_VNPU_ID:
            before = {v.id for v in self.list_vnpus(chip)}
        else:
            check_vnpu_id(vnpu_id, what)
            args += ["-v", str(vnpu_id)]
        rc, text = self._run(args)
        ok, message = parse.parse_status(text)
        if rc == 0 and ok:
            if vnpu_id != ANY_VNPU_ID:
                return VNPU(id=vnpu_id, chip=chip, template=template, in_use=False)
            return self._created(chip, before, what)
        if rc == 0 and ok is None:
            raise MalformedOutputError(f"{what}: npu-smi printed no Status", driver_message=text)
        raise classify(
            "create",
            what,
            parse.find_error_code(text),
            message,
            lambda: diagnose_create(
                self._chip_info(entry),
                self.list_templates(chip),
                self.list_vnpus(chip),
                template,
                vnpu_id,
            ),
        )

    def destroy_vnpu(self, chip: int, vnpu_id: int) -> None:
        entry = self._entry(chip)
        what = f"destroy vNPU {vnpu_id} on chip {chip}"
        check_vnpu_id(vnpu_id, what)
        args = ["set", "-t", "destroy-vnpu", "-i", str(entry.card_id), "-c", str(entry.device_id)]
        rc, text = self._run([*args, "-v", str(vnpu_id)])
        ok, message = parse.parse_status(text)
        if rc == 0 and ok:
            return
        if rc == 0 and ok is None:
            raise MalformedOutputError(f"{what}: npu-smi printed no Status", driver_message=text)
        raise classify(
            "destroy",
            what,
            parse.find_error_code(text),
            message,
            lambda: diagnose_destroy(self.list_vnpus(chip), chip, vnpu_id),
        )

    def set_config_recover(self, enabled: bool) -> None:
        what = f"{'enable' if enabled else 'disable'} config-recover mode"
        rc, text = self._run(["set", "-t", "vnpu-cfg-recover", "-d", "1" if enabled else "0"])
        ok, message = parse.parse_status(text)
        if rc != 0 or not ok:
            code = parse.find_error_code(text)
            raise error_for_code("query", code)(f"{what} failed", code=code, driver_message=message)

    # ---------------------------------------------------------------- internals

    def _run(self, args: Sequence[str]) -> tuple[int, str]:
        command = f"{self.executable} {' '.join(args)}"
        try:
            proc = subprocess.run(
                [self.executable, *args],
                capture_output=True,
                timeout=self.timeout,
                env=self._env,
                check=False,
            )
        except subprocess.TimeoutExpired:
            raise DriverFailure(f"{command} timed out after {self.timeout:g}s") from None
        except OSError as exc:
            raise DriverFailure(f"cannot run {command}: {exc}") from exc
        out = proc.stdout.decode("utf-8", errors="replace")
        err = proc.stderr.decode("utf-8", errors="replace")
        return proc.returncode, (out + ("\n" + err if err.strip() else "")).strip("\n")

    def _query(self, args: Sequence[str], what: str) -> str:
        rc, text = self._run(args)
        if rc != 0:
            code = parse.find_error_code(text)
            raise error_for_code("query", code)(
                f"{what} failed: npu-smi exited with status {rc}", code=code, driver_message=text
            )
        if not text.strip():
            raise MalformedOutputError(f"{what}: npu-smi printed nothing")
        return text

    def _topology(self) -> list[parse.ChipEntry]:
        if self._chips is None:
            text = self._query(["info", "-m"], "list chips")
            self._chips = sorted(parse.parse_chip_list(text), key=lambda c: c.logic_id)
        return self._chips

    def _entry(self, chip: int) -> parse.ChipEntry:
        entry = next((c for c in self._topology() if c.logic_id == chip), None)
        if entry is None:
            raise NotFoundError(f"npu-smi lists no chip with logic id {chip}")
        return entry

    def _vnpu_table(self, entry: parse.ChipEntry) -> parse.VnpuTable:
        args = ["info", "-t", "info-vnpu", "-i", str(entry.card_id), "-c", str(entry.device_id)]
        return parse.parse_info_vnpu(self._query(args, f"list vNPUs of chip {entry.logic_id}"))

    def _chip_info(self, entry: parse.ChipEntry) -> ChipInfo:
        table = self._vnpu_table(entry)
        where = ["-i", str(entry.card_id), "-c", str(entry.device_id)]
        health = self._query(["info", "-t", "health", *where], f"health of chip {entry.logic_id}")
        model = normalize_model(entry.name)
        physical = entry.logic_id if entry.physical_id is None else entry.physical_id
        low, high = id_range(physical, ids_per_chip_for(model))
        aicore_free, aicore_total = table.free_total("AICORE")
        aicpu_free, aicpu_total = table.free_total("AICPU")
        media_free, media_total = table.free_total("VPC")
        mem_free, mem_total = table.resources["Memory"]
        return ChipInfo(
            index=entry.logic_id,
            physical_id=physical,
            card_id=entry.card_id,
            device_id=entry.device_id,
            model=model,
            healthy=parse.parse_health(health),
            aicore_total=aicore_total,
            aicore_free=aicore_free,
            memory_total_mb=int((mem_total or 0) * 1024),
            memory_free_mb=int((mem_free or 0) * 1024),
            aicpu_total=aicpu_total,
            aicpu_free=aicpu_free,
            media_total=media_total,
            media_free=media_free,
            vnpu_id_min=low,
            vnpu_id_max=high,
        )

    def _created(self, chip: int, before: set[int], what: str) -> VNPU:
        new = [v for v in self.list_vnpus(chip) if v.id not in before]
        if len(new) != 1:
            raise DriverFailure(
                f"{what}: npu-smi reported success but {len(new)} new vNPUs appeared; "
                "cannot tell which one is ours"
            )
        return new[0]
