"""The bottom layer every part builds on: the `Sample` record and its status, the finish-reason
vocabulary, typed-config helpers, plugin loading and child-process helpers. It imports nothing
else from slimeish."""
