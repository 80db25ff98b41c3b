"""Protobuf message classes for the tests, built from a descriptor written out here (what protoc's
generated ``_pb2`` modules do with the compiled ``reviews.proto`` beside this file):

    Review          {int64 id = 1; string text = 2; optional string lang = 3;}
    EnrichedReview  {int64 id = 1; string text = 2; optional string lang = 3; repeated float embedding = 10;}
"""

from __future__ import annotations

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

_F = descriptor_pb2.FieldDescriptorProto


def _file() -> descriptor_pb2.FileDescriptorProto:
    fdp = descriptor_pb2.FileDescriptorProto(name="sluice_tests/reviews.proto", package="sluice.tests",
                                             syntax="proto3")
    for name, extra in (("Review", []), ("EnrichedReview", [("embedding", 10, _F.TYPE_FLOAT, _F.LABEL_REPEATED)])):
        message = fdp.message_type.add(name=name)
        message.field.add(name="id", number=1, type=_F.TYPE_INT64, label=_F.LABEL_OPTIONAL)
        message.field.add(name="text", number=2, type=_F.TYPE_STRING, label=_F.LABEL_OPTIONAL)
        # proto3 `optional`: explicit presence, through a synthetic oneof
        message.oneof_decl.add(name="_lang")
        message.field.add(name="lang", number=3, type=_F.TYPE_STRING, label=_F.LABEL_OPTIONAL, oneof_index=0,
                          proto3_optional=True)
        for field_name, number, kind, label in extra:
            message.field.add(name=field_name, number=number, type=kind, label=label)
    return fdp


_pool = descriptor_pool.Default()
try:
    _descriptor = _pool.FindFileByName("sluice_tests/reviews.proto")
except KeyError:
    _descriptor = _pool.Add(_file())

Review = message_factory.GetMessageClass(_descriptor.message_types_by_name["Review"])
EnrichedReview = message_factory.GetMessageClass(_descriptor.message_types_by_name["EnrichedReview"])
