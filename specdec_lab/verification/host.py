"""The reference loops' one way to read the device: a host read that counts itself."""


def host_reader(syncs=None):
    """host(x, kind=float): x read to the host as `kind`, one sync, counted in syncs["count"] where
    `syncs` is a dict (the engine's step record adds it to the step's own one read)."""
    def host(x, kind=float):
        if syncs is not None:
            syncs["count"] = syncs.get("count", 0) + 1
        return kind(x)  # sync: one host read
    return host
