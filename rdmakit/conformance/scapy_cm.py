"""scapy layers for the connection manager: DETH, the MAD header and the CM messages.

Written from IBTA Vol. 1: §9.3.3 (DETH), §13.4.2 (the MAD base header) and the
CM message tables of ch. 12 (Table 106 REQ, 107 MRA, 108 REJ, 110 REP, 111 RTU,
112 DREQ, 113 DREP), field by field in the tables' order, MSB first. The
conformance suite's CM cases build and read their MADs with these, sharing
nothing with ``rdmakit.wire.cm``.
"""

from scapy.contrib.roce import BTH
from scapy.fields import BitField, ByteField, IntField, LongField, ShortField, StrFixedLenField, XIntField
from scapy.packet import Packet, bind_layers

from .frames import DREP, DREQ, MRA, QP1_QKEY, REJ, REP, REQ, RTU, UD_SEND_ONLY

CM_MAD_BYTES = 232  # a CM message: 256-byte MAD less its 24-byte header


class DETH(Packet):
    name = "DETH"
    fields_desc = [XIntField("qkey", QP1_QKEY), ByteField("reserved", 0), BitField("srcqp", 1, 24)]  # noqa: RUF012


class MAD(Packet):
    name = "MAD"
    fields_desc = [  # noqa: RUF012 (scapy's declarative layer API)
        ByteField("base_version", 1),
        ByteField("mgmt_class", 7),
        ByteField("class_version", 2),
        ByteField("method", 3),
        ShortField("status", 0),
        ShortField("class_specific", 0),
        LongField("tid", 0),
        ShortField("attr_id", 0),
        ShortField("reserved", 0),
        IntField("attr_mod", 0),
    ]


class CmReq(Packet):
    name = "CM REQ"
    fields_desc = [  # noqa: RUF012 (scapy's declarative layer API)
        IntField("local_comm_id", 0),
        ByteField("reserved1", 0),
        BitField("vendor_id", 0, 24),
        LongField("service_id", 0),
        LongField("local_ca_guid", 0),
        IntField("reserved2", 0),
        IntField("local_qkey", 0),
        BitField("local_qpn", 0, 24),
        ByteField("responder_resources", 0),
        BitField("local_eecn", 0, 24),
        ByteField("initiator_depth", 0),
        BitField("remote_eecn", 0, 24),
        BitField("remote_cm_response_timeout", 0, 5),
        BitField("transport_service_type", 0, 2),
        BitField("e2e_flow_control", 0, 1),
        BitField("starting_psn", 0, 24),
        BitField("local_cm_response_timeout", 0, 5),
        BitField("retry_count", 0, 3),
        ShortField("pkey", 0xFFFF),
        BitField("path_mtu", 3, 4),
        BitField("rdc_exists", 0, 1),
        BitField("rnr_retry_count", 0, 3),
        BitField("max_cm_retries", 0, 4),
        BitField("srq", 0, 1),
        BitField("extended_transport", 0, 3),
        ShortField("primary_local_lid", 0xFFFF),
        ShortField("primary_remote_lid", 0xFFFF),
        StrFixedLenField("primary_local_gid", b"\0" * 16, 16),
        StrFixedLenField("primary_remote_gid", b"\0" * 16, 16),
        BitField("primary_flow_label", 0, 20),
        BitField("reserved3", 0, 6),
        BitField("primary_packet_rate", 0, 6),
        ByteField("primary_traffic_class", 0),
        ByteField("primary_hop_limit", 64),
        BitField("primary_sl", 0, 4),
        BitField("primary_subnet_local", 0, 1),
        BitField("reserved4", 0, 3),
        BitField("primary_local_ack_timeout", 0, 5),
        BitField("reserved5", 0, 3),
        StrFixedLenField("alternate_path", b"\0" * 44, 44),
        StrFixedLenField("private_data", b"\0" * 92, 92),
    ]


class _Ids(Packet):
    fields_desc = [IntField("local_comm_id", 0), IntField("remote_comm_id", 0)]  # noqa: RUF012


class CmMra(Packet):
    name = "CM MRA"
    fields_desc = [  # noqa: RUF012 (scapy's declarative layer API)
        *_Ids.fields_desc,
        BitField("message_mraed", 0, 2),
        BitField("reserved1", 0, 6),
        BitField("service_timeout", 0, 5),
        BitField("reserved2", 0, 3),
        StrFixedLenField("private_data", b"\0" * 222, 222),
    ]


class CmRej(Packet):
    name = "CM REJ"
    fields_desc = [  # noqa: RUF012 (scapy's declarative layer API)
        *_Ids.fields_desc,
        BitField("message_rejected", 0, 2),
        BitField("reserved1", 0, 6),
        BitField("rejected_info_length", 0, 7),
        BitField("reserved2", 0, 1),
        ShortField("reason", 0),
        StrFixedLenField("ari", b"\0" * 72, 72),
        StrFixedLenField("private_data", b"\0" * 148, 148),
    ]


class CmRep(Packet):
    name = "CM REP"
    fields_desc = [  # noqa: RUF012 (scapy's declarative layer API)
        *_Ids.fields_desc,
        IntField("local_qkey", 0),
        BitField("local_qpn", 0, 24),
        ByteField("vendor_id_h", 0),
        BitField("local_eecn", 0, 24),
        ByteField("vendor_id_m", 0),
        BitField("starting_psn", 0, 24),
        ByteField("vendor_id_l", 0),
        ByteField("responder_resources", 0),
        ByteField("initiator_depth", 0),
        BitField("target_ack_delay", 0, 5),
        BitField("failover_accepted", 0, 2),
        BitField("e2e_flow_control", 0, 1),
        BitField("rnr_retry_count", 0, 3),
        BitField("srq", 0, 1),
        BitField("reserved", 0, 4),
        LongField("local_ca_guid", 0),
        StrFixedLenField("private_data", b"\0" * 196, 196),
    ]


class CmRtu(Packet):
    name = "CM RTU"
    fields_desc = [*_Ids.fields_desc, StrFixedLenField("private_data", b"\0" * 224, 224)]  # noqa: RUF012


class CmDreq(Packet):
    name = "CM DREQ"
    fields_desc = [  # noqa: RUF012 (scapy's declarative layer API)
        *_Ids.fields_desc,
        BitField("remote_qpn", 0, 24),
        ByteField("reserved", 0),
        StrFixedLenField("private_data", b"\0" * 220, 220),
    ]


class CmDrep(Packet):
    name = "CM DREP"
    fields_desc = [*_Ids.fields_desc, StrFixedLenField("private_data", b"\0" * 224, 224)]  # noqa: RUF012


MESSAGES: dict[int, type[Packet]] = {REQ: CmReq, MRA: CmMra, REJ: CmRej, REP: CmRep, RTU: CmRtu, DREQ: CmDreq,
                                     DREP: CmDrep}  # fmt: skip

bind_layers(BTH, DETH, opcode=UD_SEND_ONLY)
bind_layers(DETH, MAD)
for _attr, _cls in MESSAGES.items():
    bind_layers(MAD, _cls, attr_id=_attr)
