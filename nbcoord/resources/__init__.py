"""Resources: probes (psutil, NVML, /proc), the per-cell memory ledger, reclaim."""
