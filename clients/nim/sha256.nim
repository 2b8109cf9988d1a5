## SHA-256 (FIPS 180-4, section 6.2), for the starlease client: the
## digest a fenced write is authorized for (`payload_sha256`) and the
## check of the CouchDB fence's source. Nim 1.6's standard library has no
## SHA-256; this is a plain, portable implementation (no SIMD, no
## unsafe code), fast enough for documents and messages of a few MiB.
##
## ```nim
## import sha256
## assert sha256Hex("abc") ==
##   "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
## ```
##
## For input arriving in parts, `initSha256`, `update` and `finish`.

type
  Sha256Digest* = array[32, byte]
    ## A SHA-256 digest.

  Sha256State* = object
    ## An incremental SHA-256 computation: `initSha256`, `update` any
    ## number of times, then `finish` once.
    h: array[8, uint32]      # the hash value H(i)
    buf: array[64, byte]     # a partial block
    bufLen: int              # bytes in buf
    total: uint64            # bytes hashed so far

const
  roundConstants: array[64, uint32] = [
    0x428a2f98'u32, 0x71374491'u32, 0xb5c0fbcf'u32, 0xe9b5dba5'u32,
    0x3956c25b'u32, 0x59f111f1'u32, 0x923f82a4'u32, 0xab1c5ed5'u32,
    0xd807aa98'u32, 0x12835b01'u32, 0x243185be'u32, 0x550c7dc3'u32,
    0x72be5d74'u32, 0x80deb1fe'u32, 0x9bdc06a7'u32, 0xc19bf174'u32,
    0xe49b69c1'u32, 0xefbe4786'u32, 0x0fc19dc6'u32, 0x240ca1cc'u32,
    0x2de92c6f'u32, 0x4a7484aa'u32, 0x5cb0a9dc'u32, 0x76f988da'u32,
    0x983e5152'u32, 0xa831c66d'u32, 0xb00327c8'u32, 0xbf597fc7'u32,
    0xc6e00bf3'u32, 0xd5a79147'u32, 0x06ca6351'u32, 0x14292967'u32,
    0x27b70a85'u32, 0x2e1b2138'u32, 0x4d2c6dfc'u32, 0x53380d13'u32,
    0x650a7354'u32, 0x766a0abb'u32, 0x81c2c92e'u32, 0x92722c85'u32,
    0xa2bfe8a1'u32, 0xa81a664b'u32, 0xc24b8b70'u32, 0xc76c51a3'u32,
    0xd192e819'u32, 0xd6990624'u32, 0xf40e3585'u32, 0x106aa070'u32,
    0x19a4c116'u32, 0x1e376c08'u32, 0x2748774c'u32, 0x34b0bcb5'u32,
    0x391c0cb3'u32, 0x4ed8aa4a'u32, 0x5b9cca4f'u32, 0x682e6ff3'u32,
    0x748f82ee'u32, 0x78a5636f'u32, 0x84c87814'u32, 0x8cc70208'u32,
    0x90befffa'u32, 0xa4506ceb'u32, 0xbef9a3f7'u32, 0xc67178f2'u32]
    ## K(0..63): the first 32 bits of the fractional parts of the cube
    ## roots of the first 64 primes (FIPS 180-4, 4.2.2).
  initialHash: array[8, uint32] = [
    0x6a09e667'u32, 0xbb67ae85'u32, 0x3c6ef372'u32, 0xa54ff53a'u32,
    0x510e527f'u32, 0x9b05688c'u32, 0x1f83d9ab'u32, 0x5be0cd19'u32]
    ## H(0) (FIPS 180-4, 5.3.3).
  hexDigits = "0123456789abcdef"

func rotr(x: uint32, n: int): uint32 {.inline.} =
  (x shr n) or (x shl (32 - n))

func compress(h: var array[8, uint32], blk: openArray[byte]) =
  ## Processes one 64-byte block (FIPS 180-4, 6.2.2). uint32 arithmetic
  ## wraps modulo 2^32, as the standard's additions do.
  var w: array[64, uint32]
  for t in 0 ..< 16:
    w[t] = (uint32(blk[4*t]) shl 24) or (uint32(blk[4*t + 1]) shl 16) or
           (uint32(blk[4*t + 2]) shl 8) or uint32(blk[4*t + 3])
  for t in 16 ..< 64:
    let s0 = rotr(w[t-15], 7) xor rotr(w[t-15], 18) xor (w[t-15] shr 3)
    let s1 = rotr(w[t-2], 17) xor rotr(w[t-2], 19) xor (w[t-2] shr 10)
    w[t] = w[t-16] + s0 + w[t-7] + s1
  var
    a = h[0]
    b = h[1]
    c = h[2]
    d = h[3]
    e = h[4]
    f = h[5]
    g = h[6]
    hh = h[7]
  for t in 0 ..< 64:
    let bigS1 = rotr(e, 6) xor rotr(e, 11) xor rotr(e, 25)
    let ch = (e and f) xor ((not e) and g)
    let t1 = hh + bigS1 + ch + roundConstants[t] + w[t]
    let bigS0 = rotr(a, 2) xor rotr(a, 13) xor rotr(a, 22)
    let maj = (a and b) xor (a and c) xor (b and c)
    let t2 = bigS0 + maj
    hh = g
    g = f
    f = e
    e = d + t1
    d = c
    c = b
    b = a
    a = t1 + t2
  h[0] += a
  h[1] += b
  h[2] += c
  h[3] += d
  h[4] += e
  h[5] += f
  h[6] += g
  h[7] += hh

func initSha256*(): Sha256State =
  ## A fresh computation.
  result.h = initialHash

func update*(s: var Sha256State, data: openArray[byte]) =
  ## Hashes the next bytes of the message.
  s.total += uint64(data.len)
  var i = 0
  if s.bufLen > 0:
    while s.bufLen < 64 and i < data.len:
      s.buf[s.bufLen] = data[i]
      inc s.bufLen
      inc i
    if s.bufLen < 64: return
    compress(s.h, s.buf)
    s.bufLen = 0
  while i + 64 <= data.len:
    compress(s.h, data.toOpenArray(i, i + 63))
    i += 64
  while i < data.len:
    s.buf[s.bufLen] = data[i]
    inc s.bufLen
    inc i

func update*(s: var Sha256State, data: string) =
  ## Hashes the next bytes of the message: the bytes of data as they are
  ## (a Nim string holds UTF-8 as bytes).
  s.update(data.toOpenArrayByte(0, data.high))

func finish*(s: var Sha256State): Sha256Digest =
  ## Pads the message (a 1 bit, zeros, its length in bits as 64 bits big
  ## endian: FIPS 180-4, 5.1.1) and answers the digest. The state is used
  ## up; start again with `initSha256`.
  let bits = s.total * 8
  var pad: array[72, byte]
  pad[0] = 0x80
  # Zeros up to 56 bytes mod 64, then the 8 length bytes.
  let zeros = (if s.bufLen < 56: 55 - s.bufLen else: 119 - s.bufLen)
  for i in 0 ..< 8:
    pad[1 + zeros + i] = byte((bits shr (56 - 8*i)) and 0xff)
  let total = s.total
  s.update(pad.toOpenArray(0, zeros + 8))
  s.total = total
  assert s.bufLen == 0
  for i in 0 ..< 8:
    result[4*i] = byte(s.h[i] shr 24)
    result[4*i + 1] = byte((s.h[i] shr 16) and 0xff)
    result[4*i + 2] = byte((s.h[i] shr 8) and 0xff)
    result[4*i + 3] = byte(s.h[i] and 0xff)

func sha256Digest*(data: openArray[byte]): Sha256Digest =
  ## The SHA-256 of data.
  var s = initSha256()
  s.update(data)
  s.finish()

func sha256Digest*(data: string): Sha256Digest =
  ## The SHA-256 of the bytes of data.
  var s = initSha256()
  s.update(data)
  s.finish()

func hexDigest*(d: Sha256Digest): string =
  ## d as 64 lower-case hex digits, the form `payload_sha256` takes.
  result = newString(64)
  for i, b in d:
    result[2*i] = hexDigits[int(b shr 4)]
    result[2*i + 1] = hexDigits[int(b and 0x0f)]

func sha256Hex*(data: openArray[byte]): string =
  ## The SHA-256 of data as 64 lower-case hex digits.
  hexDigest(sha256Digest(data))

func sha256Hex*(data: string): string =
  ## The SHA-256 of the bytes of data as 64 lower-case hex digits.
  hexDigest(sha256Digest(data))
