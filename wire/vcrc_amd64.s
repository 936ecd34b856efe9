//go:build amd64 && !purego

#include "textflag.h"

// func vcrcFold(init uint64, p *byte, n int, k *[4]uint64) (lo, hi uint64)
//
// Folds 16-byte blocks with PCLMULQDQ: four in flight (constants k[0],
// k[1]: by 512 bits) while 64 bytes are left, then the four into one and
// the rest one by one (k[2], k[3]: by 128 bits). In each block the low
// quadword (the first 8 bytes) is the high-order half in the bit-reflected
// order: $0x00 multiplies it by k[0] or k[2], $0x11 the high quadword by
// k[1] or k[3].
TEXT ·vcrcFold(SB), NOSPLIT, $0-48
	MOVQ init+0(FP), AX
	MOVQ p+8(FP), SI
	MOVQ n+16(FP), CX
	MOVQ k+24(FP), DX

	MOVOU 0(SI), X1
	MOVOU 16(SI), X2
	MOVOU 32(SI), X3
	MOVOU 48(SI), X4
	MOVQ  AX, X9
	PXOR  X9, X1
	ADDQ  $64, SI
	SUBQ  $64, CX
	MOVOU 0(DX), X0

loop64:
	CMPQ CX, $64
	JB   fold4
	MOVOA X1, X5
	MOVOA X2, X6
	MOVOA X3, X7
	MOVOA X4, X8
	PCLMULQDQ $0x00, X0, X1
	PCLMULQDQ $0x00, X0, X2
	PCLMULQDQ $0x00, X0, X3
	PCLMULQDQ $0x00, X0, X4
	PCLMULQDQ $0x11, X0, X5
	PCLMULQDQ $0x11, X0, X6
	PCLMULQDQ $0x11, X0, X7
	PCLMULQDQ $0x11, X0, X8
	PXOR  X5, X1
	PXOR  X6, X2
	PXOR  X7, X3
	PXOR  X8, X4
	MOVOU 0(SI), X11
	MOVOU 16(SI), X12
	MOVOU 32(SI), X13
	MOVOU 48(SI), X14
	PXOR  X11, X1
	PXOR  X12, X2
	PXOR  X13, X3
	PXOR  X14, X4
	ADDQ  $64, SI
	SUBQ  $64, CX
	JMP   loop64

fold4:
	MOVOU 16(DX), X0
	MOVOA X1, X5
	PCLMULQDQ $0x00, X0, X1
	PCLMULQDQ $0x11, X0, X5
	PXOR  X5, X1
	PXOR  X1, X2
	MOVOA X2, X5
	PCLMULQDQ $0x00, X0, X2
	PCLMULQDQ $0x11, X0, X5
	PXOR  X5, X2
	PXOR  X2, X3
	MOVOA X3, X5
	PCLMULQDQ $0x00, X0, X3
	PCLMULQDQ $0x11, X0, X5
	PXOR  X5, X3
	PXOR  X3, X4

loop16:
	CMPQ CX, $16
	JB   done
	MOVOA X4, X5
	PCLMULQDQ $0x00, X0, X4
	PCLMULQDQ $0x11, X0, X5
	PXOR  X5, X4
	MOVOU 0(SI), X11
	PXOR  X11, X4
	ADDQ  $16, SI
	SUBQ  $16, CX
	JMP   loop16

done:
	MOVQ   X4, AX
	MOVQ   AX, lo+32(FP)
	PSRLDQ $8, X4
	MOVQ   X4, AX
	MOVQ   AX, hi+40(FP)
	RET
