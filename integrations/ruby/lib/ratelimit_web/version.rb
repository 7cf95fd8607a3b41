# frozen_string_literal: true

module RatelimitWeb
  VERSION = "0.3.0"
end
