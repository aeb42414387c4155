package packet

import "encoding/binary"

// Piece is one fragment to cut from a datagram: Len bytes of its
// fragmentable part from byte Off (a multiple of 8). Data, when set,
// replaces those bytes: overlapping fragments that disagree.
type Piece struct {
	Off, Len int
	Data     []byte
}

// Fragments cuts an unfragmented IPv4 or IPv6 frame (as Frame.Bytes builds
// it, VLAN tags allowed) into fragments with identification id. For IPv6
// the fragment header goes after a leading hop-by-hop header, the only
// header of the unfragmentable part this builder makes. Every fragment but
// the one reaching the end has More Fragments set.
func Fragments(frame []byte, id uint32, pieces ...Piece) [][]byte {
	l2 := L3Offset(frame)
	var out [][]byte
	if frame[l2]>>4 == 4 {
		hl := int(frame[l2]&0xf) * 4
		tot := int(binary.BigEndian.Uint16(frame[l2+2:]))
		payload := frame[l2+hl : l2+tot]
		for _, p := range pieces {
			data := pieceData(payload, p)
			f := append(append([]byte{}, frame[:l2+hl]...), data...)
			ip := f[l2:]
			binary.BigEndian.PutUint16(ip[2:], uint16(hl+len(data)))
			binary.BigEndian.PutUint16(ip[4:], uint16(id))
			fo := uint16(p.Off / 8)
			if p.Off+p.Len < len(payload) {
				fo |= 0x2000
			}
			binary.BigEndian.PutUint16(ip[6:], fo)
			ip[10], ip[11] = 0, 0
			binary.BigEndian.PutUint16(ip[10:], Checksum(ip[:hl]))
			out = append(out, f)
		}
		return out
	}
	unfrag := l2 + 40
	nh := frame[l2+6]
	if nh == 0 { // a leading hop-by-hop header stays in every fragment
		nh = frame[unfrag]
		unfrag += (int(frame[unfrag+1]) + 1) * 8
	}
	end := l2 + 40 + int(binary.BigEndian.Uint16(frame[l2+4:]))
	payload := frame[unfrag:end]
	for _, p := range pieces {
		data := pieceData(payload, p)
		fh := make([]byte, 8)
		fh[0] = nh
		fo := uint16(p.Off/8) << 3
		if p.Off+p.Len < len(payload) {
			fo |= 1
		}
		binary.BigEndian.PutUint16(fh[2:], fo)
		binary.BigEndian.PutUint32(fh[4:], id)
		f := append(append(append([]byte{}, frame[:unfrag]...), fh...), data...)
		binary.BigEndian.PutUint16(f[l2+4:], uint16(len(f)-l2-40))
		if unfrag == l2+40 {
			f[l2+6] = 44
		} else {
			f[l2+40] = 44 // the hop-by-hop header now names the fragment header
		}
		out = append(out, f)
	}
	return out
}

// L3Offset is where the IP header of a frame starts: after the Ethernet
// header and its VLAN tags.
func L3Offset(frame []byte) int {
	off := 14
	for et := binary.BigEndian.Uint16(frame[12:]); et == 0x8100 || et == 0x88a8; et = binary.BigEndian.Uint16(frame[off-2:]) {
		off += 4
	}
	return off
}

func pieceData(payload []byte, p Piece) []byte {
	if p.Data != nil {
		return p.Data
	}
	end := min(p.Off+p.Len, len(payload))
	if p.Off >= end {
		return nil
	}
	return payload[p.Off:end]
}
