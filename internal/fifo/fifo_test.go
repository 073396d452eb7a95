package fifo

import "testing"

func TestPop(t *testing.T) {
	q := []int{1, 2}
	backing := q
	for _, want := range []int{1, 2} {
		if v, ok := Pop(&q); !ok || v != want {
			t.Fatalf("Pop = %d, %v; want %d, true", v, ok, want)
		}
	}
	if v, ok := Pop(&q); ok {
		t.Fatalf("Pop of an empty queue = %d, true", v)
	}
	if backing[0] != 0 || backing[1] != 0 {
		t.Errorf("popped elements stay in the backing array: %v", backing)
	}
}
