

def on_sm90() -> bool:
    """Whether a compute capability 9.0 GPU is usable here (the sm_90a kernels run only there)."""
    try:
        from polykit.runtime.cuda import driver

        return driver.is_available() and driver.current_device().arch == "sm_90"
    except Exception:  # no driver, no GPU
        return False
