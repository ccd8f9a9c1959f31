//! The pgoutput decoder never allocates in proportion to a length or count read from the
//! wire: measured with a counting global allocator (this test binary only), per thread, so
//! other tests running at the same time do not disturb the figures.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

use proptest::collection::vec;
use proptest::prelude::*;
use railhook_relay::pgoutput::{decode, DecodeError};

struct Counting;

thread_local! {
    /// Bytes requested by this thread since the last reset, and the largest single request.
    static TOTAL: Cell<usize> = const { Cell::new(0) };
    static LARGEST: Cell<usize> = const { Cell::new(0) };
}

fn note(size: usize) {
    // `try_with`: the thread-local may already be gone while a thread shuts down.
    let _ = TOTAL.try_with(|t| t.set(t.get() + size));
    let _ = LARGEST.try_with(|l| l.set(l.get().max(size)));
}

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        note(layout.size());
        unsafe { System.alloc(layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        note(layout.size());
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        note(new_size);
        unsafe { System.realloc(ptr, layout, new_size) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// Decodes `data` and returns the result with the bytes allocated meanwhile (total, largest).
fn measured(data: &[u8]) -> (Result<(), DecodeError>, usize, usize) {
    TOTAL.with(|t| t.set(0));
    LARGEST.with(|l| l.set(0));
    let result = decode(data).map(drop);
    (result, TOTAL.with(Cell::get), LARGEST.with(Cell::get))
}

/// At most this many bytes per input byte, plus a constant: a tuple value is 32 bytes and
/// takes at least one input byte; everything else is smaller per byte.
fn bound(input: usize) -> usize {
    1024 + 64 * input
}

fn insert_with_text(len_field: u32, count: u16, data: &[u8]) -> Vec<u8> {
    let mut m = vec![b'I', 0, 0, 0x4a, 0x04, b'N'];
    m.extend_from_slice(&count.to_be_bytes());
    m.push(b't');
    m.extend_from_slice(&len_field.to_be_bytes());
    m.extend_from_slice(data);
    m
}

#[test]
fn huge_declared_lengths_allocate_nothing_of_their_size() {
    // Insert: one text value that claims 2 GiB, with 10 bytes behind it.
    let (r, total, largest) = measured(&insert_with_text(i32::MAX as u32, 1, b"0123456789"));
    assert!(matches!(r, Err(DecodeError::Truncated { .. })), "{r:?}");
    assert!(total < 256, "{total} bytes allocated for a 25-byte message");
    assert!(largest < 128, "{largest}");

    // Insert claiming 65535 values with three bytes behind: the reservation follows the bytes.
    let mut m = vec![b'I', 0, 0, 0, 1, b'N', 0xff, 0xff];
    m.extend_from_slice(b"nnn");
    let (r, total, _) = measured(&m);
    assert!(matches!(r, Err(DecodeError::Truncated { .. })), "{r:?}");
    assert!(total <= bound(m.len()), "{total}");
    assert!(total < 65_535, "a count of 65535 reserved {total} bytes");

    // Relation claiming 65535 columns.
    let mut m = vec![b'R', 0, 0, 0, 1, b'p', 0, b't', 0, b'd', 0xff, 0xff];
    m.extend_from_slice(&[0, b'c', 0, 0, 0, 0, 20, 0xff, 0xff, 0xff, 0xff]);
    let (r, total, _) = measured(&m);
    assert!(matches!(r, Err(DecodeError::Truncated { .. })), "{r:?}");
    assert!(total <= bound(m.len()) && total < 65_535, "{total}");

    // A logical message whose content length claims 2 GiB.
    let mut m = vec![b'M', 0, 0, 0, 0, 0, 0, 0, 0, 1, b'r', b'h', 0, 0x7f, 0xff, 0xff, 0xff];
    m.extend_from_slice(b"heartbeat");
    let (r, total, _) = measured(&m);
    assert!(matches!(r, Err(DecodeError::Truncated { .. })), "{r:?}");
    assert!(total < 256, "{total}");
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(3_000))]

    /// Whatever the bytes, the decoder allocates at most a constant plus a small multiple of
    /// the input's length, never what a length or count field says.
    #[test]
    fn allocation_is_bounded_by_the_input(tag in proptest::sample::select(b"BCRIMOY".to_vec()), rest in prop_oneof![vec(any::<u8>(), 0..200), vec(0u8..128, 0..200), vec(proptest::sample::select(vec![0u8, 0xff, b'n', b't', b'N', 1]), 0..200)]) {
        let mut data = vec![tag];
        data.extend_from_slice(&rest);
        let (_, total, _) = measured(&data);
        prop_assert!(total <= bound(data.len()), "{} bytes allocated for {} input bytes", total, data.len());
    }

    /// Inserts whose length fields claim anything up to 2 GiB allocate like the bytes there.
    #[test]
    fn inflated_lengths_allocate_like_the_input(len in any::<u32>(), count in any::<u16>(), data in vec(any::<u8>(), 0..100)) {
        let m = insert_with_text(len, count, &data);
        let (_, total, _) = measured(&m);
        prop_assert!(total <= bound(m.len()), "{} bytes for {} input bytes (length field {})", total, m.len(), len);
    }
}
