/* Big-endian stores shared by the broker's C extensions (_diskcodec.c, _frames.c):
 * included, not compiled on its own. */
#ifndef SRTM_BIGENDIAN_H
#define SRTM_BIGENDIAN_H

#include <stdint.h>

static inline void put32(unsigned char *p, uint32_t v) {
    p[0] = (unsigned char)(v >> 24);
    p[1] = (unsigned char)(v >> 16);
    p[2] = (unsigned char)(v >> 8);
    p[3] = (unsigned char)v;
}

static inline void put64(unsigned char *p, long long s) {
    unsigned long long v = (unsigned long long)s;
    for (int i = 7; i >= 0; i--) {
        p[i] = (unsigned char)v;
        v >>= 8;
    }
}

#endif
