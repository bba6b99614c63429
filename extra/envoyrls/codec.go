package envoyrls

import (
	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/encoding/proto"
)

// serverCodec encodes and decodes the messages of the gRPC server.
var serverCodec = encoding.GetCodecV2(proto.Name)
