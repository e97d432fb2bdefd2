"""A real gRPC server and client (Debian's python3-grpcio, the gRPC C core) for the
end-to-end tests. No generated code: methods are generic handlers over raw bytes.

  grpc_peer.py serve PORT          unary method /portcullis.test.Echo/Call on 127.0.0.1:PORT
                                   (h2c, prior knowledge); prints "ready" once listening
  grpc_peer.py call ADDR PAYLOAD   one unary call; prints a JSON line with the result

The server answers PAYLOAD by its prefix:
  "unavailable:"  -> status UNAVAILABLE (a backend error for culling)
  "invalid:"      -> status INVALID_ARGUMENT (the caller's error, not the backend's)
  anything else   -> OK, echoing "echo:" + PAYLOAD
and always sends the trailing metadata x-peer-trailer: served (a trailer).
"""
import json
import sys
from concurrent import futures

import grpc

METHOD = "/portcullis.test.Echo/Call"


def serve(port):
    def call(request, context):
        context.set_trailing_metadata((("x-peer-trailer", "served"),))
        if request.startswith(b"unavailable:"):
            context.abort(grpc.StatusCode.UNAVAILABLE, "backend unavailable")
        if request.startswith(b"invalid:"):
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "bad argument")
        return b"echo:" + request

    handler = grpc.method_handlers_generic_handler(
        "portcullis.test.Echo",
        {"Call": grpc.unary_unary_rpc_method_handler(call)},
    )
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
    server.add_generic_rpc_handlers((handler,))
    server.add_insecure_port(f"127.0.0.1:{port}")
    server.start()
    print("ready", flush=True)
    server.wait_for_termination()


def call(addr, payload):
    with grpc.insecure_channel(addr) as channel:
        stub = channel.unary_unary(METHOD)
        out = {"code": "OK", "details": "", "reply": "", "trailers": {}}
        try:
            reply, c = stub.with_call(payload.encode(), timeout=10)
            out["reply"] = reply.decode()
            trailers = c.trailing_metadata()
        except grpc.RpcError as e:
            out["code"] = e.code().name
            out["details"] = e.details() or ""
            trailers = e.trailing_metadata()
        out["trailers"] = {k: v for k, v in (trailers or ())}
        print(json.dumps(out), flush=True)


if __name__ == "__main__":
    if sys.argv[1] == "serve":
        serve(int(sys.argv[2]))
    else:
        call(sys.argv[2], sys.argv[3])
