"""tidegate wire protocol: ``tidegate.proto``, its generated module and the frame codec.

See ``proto.codec`` for the multipart frame layout.
"""
