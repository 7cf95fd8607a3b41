# frozen_string_literal: true

module RatelimitWeb
  VERSION = "0.4.0"
end
