"""`tinkrl serve tinker`: the Tinker HTTP protocol (tinker SDK 0.38.0) over the embedded engine.

wire.py          protobuf/JSON codecs, using the SDK's own proto schema
futures.py       request ids and the long-poll `retrieve_future` table
sessions.py      sessions, per-model seq_id ordering, sampling sessions
engine_calls.py  awaiting engine futures without blocking the event loop
app.py           the aiohttp routes, auth, and clear errors for what is not served
cli.py           `tinkrl serve tinker ...` and `serve_in_thread` for tests and benchmarks
"""
