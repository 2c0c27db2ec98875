"""The engine: requests, the scheduler and block manager, the step loop and its thread, text in and out.
Data in, data out: no torch and no gRPC here; the model layer (worker/model/) plugs a runner into it."""
