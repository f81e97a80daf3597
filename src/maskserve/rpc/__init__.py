"""The Open Inference Protocol over gRPC: Triton's ``inference.GRPCInferenceService``, with the
standard health service and server reflection, in the same process and event loop as the HTTP
server, on ``--grpc-port``. Each RPC is an adapter over the same service, tasks, admission and
errors as the REST routes; no batching or admission of its own."""


class GrpcPortUnavailable(OSError):
    """The gRPC port cannot be bound (in use, not an address of this machine, no permission); its
    message names the address. Here, where nothing imports grpcio, for the entry point to catch."""


# The methods that queue work for a model, named here where nothing imports grpcio, so that the
# route table can tell the metrics' readers (deploy/) without starting anything.
INFERENCE_METHODS = frozenset({"ModelInfer", "ModelStreamInfer"})
