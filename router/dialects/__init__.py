"""The APIs agents speak, one module each, over one turn pipeline (`slimeish.router.pipeline`).

A dialect converts its request into a `Conversation` (chat messages, chat-format tools, sampling)
and a turn's generations into its response body and stream events; everything between (capture,
engines, recording) is shared, so every dialect is captured exactly the same way. A new dialect is
one module here plus its routes in `slimeish.router.dispatch`.
"""
