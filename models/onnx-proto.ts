// The part of the ONNX IR (onnx/onnx.proto, IR version 8) that a decoder export needs, as a
// protobufjs JSON descriptor written from the public spec; field numbers are the spec's. Encoding
// goes through protobufjs rather than a hand-rolled writer: varints, packed repeated fields and
// nested lengths are its job, and a field number typed wrong here fails loudly in onnxruntime.

import protobuf from 'protobufjs';

/** TensorProto.DataType values used by the export. */
export const DataType = { FLOAT: 1, UINT8: 2, INT32: 6, INT64: 7, BOOL: 9 } as const;
export type DataTypeCode = (typeof DataType)[keyof typeof DataType];

/** AttributeProto.AttributeType values. */
export const AttributeType = { FLOAT: 1, INT: 2, STRING: 3, TENSOR: 4, FLOATS: 6, INTS: 7 } as const;

const SCHEMA = {
  nested: {
    onnx: {
      nested: {
        StringStringEntryProto: { fields: { key: { type: 'string', id: 1 }, value: { type: 'string', id: 2 } } },
        OperatorSetIdProto: { fields: { domain: { type: 'string', id: 1 }, version: { type: 'int64', id: 2 } } },
        TensorProto: {
          fields: {
            dims: { rule: 'repeated', type: 'int64', id: 1 },
            dataType: { type: 'int32', id: 2 },
            floatData: { rule: 'repeated', type: 'float', id: 4 },
            int32Data: { rule: 'repeated', type: 'int32', id: 5 },
            int64Data: { rule: 'repeated', type: 'int64', id: 7 },
            name: { type: 'string', id: 8 },
            rawData: { type: 'bytes', id: 9 },
            externalData: { rule: 'repeated', type: 'StringStringEntryProto', id: 13 },
            dataLocation: { type: 'int32', id: 14 },  // 0 DEFAULT, 1 EXTERNAL
          },
        },
        AttributeProto: {
          fields: {
            name: { type: 'string', id: 1 },
            f: { type: 'float', id: 2 },
            i: { type: 'int64', id: 3 },
            s: { type: 'bytes', id: 4 },
            t: { type: 'TensorProto', id: 5 },
            floats: { rule: 'repeated', type: 'float', id: 7 },
            ints: { rule: 'repeated', type: 'int64', id: 8 },
            type: { type: 'int32', id: 20 },
          },
        },
        NodeProto: {
          fields: {
            input: { rule: 'repeated', type: 'string', id: 1 },
            output: { rule: 'repeated', type: 'string', id: 2 },
            name: { type: 'string', id: 3 },
            opType: { type: 'string', id: 4 },
            attribute: { rule: 'repeated', type: 'AttributeProto', id: 5 },
            domain: { type: 'string', id: 7 },
          },
        },
        TensorShapeProto: {
          fields: { dim: { rule: 'repeated', type: 'Dimension', id: 1 } },
          nested: {
            Dimension: {
              oneofs: { value: { oneof: ['dimValue', 'dimParam'] } },
              fields: { dimValue: { type: 'int64', id: 1 }, dimParam: { type: 'string', id: 2 } },
            },
          },
        },
        TypeProto: {
          fields: { tensorType: { type: 'Tensor', id: 1 } },
          nested: {
            Tensor: { fields: { elemType: { type: 'int32', id: 1 }, shape: { type: 'TensorShapeProto', id: 2 } } },
          },
        },
        ValueInfoProto: { fields: { name: { type: 'string', id: 1 }, type: { type: 'TypeProto', id: 2 } } },
        GraphProto: {
          fields: {
            node: { rule: 'repeated', type: 'NodeProto', id: 1 },
            name: { type: 'string', id: 2 },
            initializer: { rule: 'repeated', type: 'TensorProto', id: 5 },
            input: { rule: 'repeated', type: 'ValueInfoProto', id: 11 },
            output: { rule: 'repeated', type: 'ValueInfoProto', id: 12 },
          },
        },
        ModelProto: {
          fields: {
            irVersion: { type: 'int64', id: 1 },
            producerName: { type: 'string', id: 2 },
            producerVersion: { type: 'string', id: 3 },
            graph: { type: 'GraphProto', id: 7 },
            opsetImport: { rule: 'repeated', type: 'OperatorSetIdProto', id: 8 },
            metadataProps: { rule: 'repeated', type: 'StringStringEntryProto', id: 14 },
          },
        },
      },
    },
  },
};

// Plain-object shapes of the messages above (camelCase, as protobufjs names fields).
export interface TensorMessage {
  name: string;
  dims: number[];
  dataType: DataTypeCode;
  rawData?: Uint8Array;
  externalData?: Array<{ key: string; value: string }>;
  dataLocation?: number;
}
export interface AttributeMessage {
  name: string;
  type: number;
  f?: number;
  i?: number;
  s?: Uint8Array;
  t?: TensorMessage;
  floats?: number[];
  ints?: number[];
}
export interface NodeMessage {
  name: string;
  opType: string;
  domain?: string;
  input: string[];
  output: string[];
  attribute: AttributeMessage[];
}
export interface ValueInfoMessage {
  name: string;
  type: { tensorType: { elemType: DataTypeCode; shape: { dim: Array<{ dimValue: number } | { dimParam: string }> } } };
}
export interface ModelMessage {
  irVersion: number;
  producerName: string;
  producerVersion: string;
  opsetImport: Array<{ domain: string; version: number }>;
  metadataProps: Array<{ key: string; value: string }>;
  graph: {
    name: string;
    node: NodeMessage[];
    initializer: TensorMessage[];
    input: ValueInfoMessage[];
    output: ValueInfoMessage[];
  };
}

let modelType: protobuf.Type | undefined;

/** The serialized ModelProto. Large tensors belong in external data: protobuf caps a message at 2 GiB. */
export function encodeModel(model: ModelMessage): Uint8Array {
  modelType ??= protobuf.Root.fromJSON(SCHEMA).lookupType('onnx.ModelProto');
  const message = modelType.fromObject(model);
  return modelType.encode(message).finish();
}
