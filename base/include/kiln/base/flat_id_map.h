// FlatIdMap<Id, V>: a map from an integer id to a small value, stored flat (open addressing,
// linear probing, deletion by backward shift: no tombstones, no node per entry). `Id` is an id
// type with `std::uint64_t value()` and an explicit constructor from std::uint64_t (ir::TensorId);
// the all-ones value is reserved (ids count up from 0).
//
// For the op path's per-tensor tables (a stream queue's variables, the device's producer
// table): every operation inserts its outputs and erases its consumed inputs, and a node-based
// std::unordered_map paid a malloc and a free for each. Not thread-safe (callers lock or own it).
//
// The subset of std::unordered_map's interface those tables use: operator[], insert_or_assign,
// erase, find, at, count, size, empty, clear, and iteration over entries with `.first` (the id)
// and `.second` (the value), in no particular order; any insertion or erasure invalidates
// iterators and pointers.
//
//   FlatIdMap<ir::TensorId, ir::TensorStatus> m;
//   m[TensorId(3)] = TensorStatus::ReadOnly;
//   for (const auto& [id, status] : m) ...
#pragma once

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

namespace kiln {

template <class Id, class V>
class FlatIdMap {
 public:
  struct Entry {
    Id first{kEmptyKey};
    V second{};
  };

  template <class E>
  class Iter {
   public:
    Iter(E* at, E* end) : at_(at), end_(end) { skip(); }
    E& operator*() const { return *at_; }
    E* operator->() const { return at_; }
    Iter& operator++() {
      ++at_;
      skip();
      return *this;
    }
    friend bool operator==(const Iter& a, const Iter& b) { return a.at_ == b.at_; }

   private:
    void skip() {
      while (at_ != end_ && at_->first.value() == kEmptyKey) ++at_;
    }
    E* at_;
    E* end_;
  };
  using iterator = Iter<Entry>;
  using const_iterator = Iter<const Entry>;

  FlatIdMap() = default;

  std::size_t size() const { return used_; }
  bool empty() const { return used_ == 0; }

  iterator begin() { return iterator(slots_.data(), slots_.data() + slots_.size()); }
  iterator end() { return iterator(slots_.data() + slots_.size(), slots_.data() + slots_.size()); }
  const_iterator begin() const { return const_iterator(slots_.data(), slots_.data() + slots_.size()); }
  const_iterator end() const { return const_iterator(slots_.data() + slots_.size(), slots_.data() + slots_.size()); }

  // nullptr when absent.
  V* find(Id id) {
    const std::size_t i = index_of(id.value());
    return i == kNotFound ? nullptr : &slots_[i].second;
  }
  const V* find(Id id) const {
    const std::size_t i = index_of(id.value());
    return i == kNotFound ? nullptr : &slots_[i].second;
  }
  std::size_t count(Id id) const { return index_of(id.value()) == kNotFound ? 0 : 1; }
  const V& at(Id id) const {
    const V* v = find(id);
    if (v == nullptr) throw std::out_of_range("FlatIdMap::at: no entry for id " + std::to_string(id.value()));
    return *v;
  }

  // The value of `id`, inserted value-initialized if absent.
  V& operator[](Id id) { return slots_[slot_for(id.value())].second; }
  void insert_or_assign(Id id, V value) { (*this)[id] = std::move(value); }

  // Returns whether an entry was removed.
  bool erase(Id id) {
    std::size_t hole = index_of(id.value());
    if (hole == kNotFound) return false;
    // Backward shift: move each later entry of the run whose home does not lie cyclically in
    // (hole, j] into the hole, so every entry stays reachable from its home slot.
    const std::size_t mask = slots_.size() - 1;
    for (std::size_t j = (hole + 1) & mask; slots_[j].first.value() != kEmptyKey; j = (j + 1) & mask) {
      const std::size_t h = home(slots_[j].first.value());
      const bool stays = hole <= j ? (hole < h && h <= j) : (hole < h || h <= j);
      if (stays) continue;
      slots_[hole] = std::move(slots_[j]);
      hole = j;
    }
    slots_[hole] = Entry{};
    --used_;
    return true;
  }

  void clear() {
    slots_.clear();
    used_ = 0;
  }

 private:
  static constexpr std::uint64_t kEmptyKey = ~std::uint64_t{0};  // never an id: ids count up from 0
  static constexpr std::size_t kNotFound = ~std::size_t{0};
  static constexpr std::size_t kInitialSlots = 16;

  // Ids are mostly consecutive integers: a multiplicative mix spreads them over the slots.
  std::size_t home(std::uint64_t key) const {
    return static_cast<std::size_t>((key * 0x9E3779B97F4A7C15ull) >> 24) & (slots_.size() - 1);
  }

  std::size_t index_of(std::uint64_t key) const {
    if (slots_.empty()) return kNotFound;
    const std::size_t mask = slots_.size() - 1;
    for (std::size_t i = home(key);; i = (i + 1) & mask) {
      if (slots_[i].first.value() == key) return i;
      if (slots_[i].first.value() == kEmptyKey) return kNotFound;
    }
  }

  // The slot holding `key`, claimed (value-initialized) if absent.
  std::size_t slot_for(std::uint64_t key) {
    if (slots_.empty() || 2 * (used_ + 1) > slots_.size()) grow();  // load <= 1/2
    const std::size_t mask = slots_.size() - 1;
    std::size_t i = home(key);
    while (slots_[i].first.value() != kEmptyKey && slots_[i].first.value() != key) i = (i + 1) & mask;
    if (slots_[i].first.value() == kEmptyKey) {
      slots_[i].first = Id(key);
      ++used_;
    }
    return i;
  }

  void grow() {
    std::vector<Entry> old = std::move(slots_);
    slots_.assign(old.empty() ? kInitialSlots : old.size() * 2, Entry{});
    used_ = 0;
    for (Entry& e : old)
      if (e.first.value() != kEmptyKey) slots_[slot_for(e.first.value())].second = std::move(e.second);
  }

  std::vector<Entry> slots_;
  std::size_t used_ = 0;
};

}  // namespace kiln
