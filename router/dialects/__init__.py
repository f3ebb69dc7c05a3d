"""The APIs agents speak, one module each, over one turn pipeline (`slimeish.router.pipeline`).

A dialect implements `base.Dialect`: its request becomes a `Conversation` (chat messages,
chat-format tools, sampling) and a turn's generations its response body and stream events;
`base.endpoint` runs everything between (capture, engines, recording) the same way for all, so
every dialect is captured exactly the same way. A new dialect is one module here plus its routes
in `slimeish.router.dispatch`.
"""
