"""The OCI backend (runc, runsc): ``warren.runtime.oci.runtime.OciRuntime``, and ``command``, the one
wrapper for running external tools. Import the submodules directly; this package stays import-light so
that ``command`` has no dependency on the rest of the backend."""
